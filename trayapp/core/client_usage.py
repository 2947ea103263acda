"""Who is using the server (#22): proxied requests summed per client — requests, tokens, time and the
wait for a slot. Pure: rows in (the store's `requests` rows or records), a table out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trayapp.core.units import as_float

UNNAMED = "(not proxied)"  # requests whose client no proxy saw
_SUMS = ("requests", "prompt", "decode", "busy", "queued", "wait")
# The fields client_usage reads: a record's row of just these (not `asdict`, 75 ms for 2,000 records).
USAGE_FIELDS = ("client_name", "prompt_tokens", "decode_tokens", "decode_tok_s", "ttft_s", "queue_wait_s")


def usage_row(record: object) -> dict[str, object]:
    """The fields of a record (a RequestRecord) that client_usage reads."""
    return {name: getattr(record, name) for name in USAGE_FIELDS}


@dataclass(frozen=True)
class ClientUsage:
    client: str  # the process name ("aider"), a User-Agent product, or UNNAMED
    requests: int
    prompt_tokens: int
    decode_tokens: int
    busy_s: float  # the server's time on its requests: TTFT plus decode tokens ÷ decode rate
    queued_requests: int  # of its requests, those whose queue wait is known
    queue_wait_total_s: float
    queue_wait_max_s: float | None

    @property
    def queue_wait_mean_s(self) -> float | None:
        return self.queue_wait_total_s / self.queued_requests if self.queued_requests else None


def client_usage(rows: Iterable[Mapping[str, object]]) -> list[ClientUsage]:
    """One line per client, the busiest (most requests) first; requests with no client last, as UNNAMED."""
    sums: dict[str, dict[str, float]] = {}
    longest: dict[str, float | None] = {}
    for row in rows:
        name = row.get("client_name")
        client = name if isinstance(name, str) and name else UNNAMED
        total = sums.setdefault(client, dict.fromkeys(_SUMS, 0.0))
        total["requests"] += 1
        total["prompt"] += as_float(row.get("prompt_tokens")) or 0
        decode_tokens = as_float(row.get("decode_tokens")) or 0
        total["decode"] += decode_tokens
        decode_tok_s = as_float(row.get("decode_tok_s"))
        decode_s = decode_tokens / decode_tok_s if decode_tok_s else 0
        total["busy"] += (as_float(row.get("ttft_s")) or 0) + decode_s
        wait_s = as_float(row.get("queue_wait_s"))
        if wait_s is not None:
            total["queued"] += 1
            total["wait"] += wait_s
            longest[client] = max(wait_s, longest.get(client) or 0.0)
    usage = [
        ClientUsage(
            client, int(t["requests"]), int(t["prompt"]), int(t["decode"]), t["busy"], int(t["queued"]),
            t["wait"], longest.get(client),
        )
        for client, t in sums.items()
    ]  # fmt: skip
    return sorted(usage, key=lambda u: (u.client == UNNAMED, -u.requests, u.client))


def client_usage_rows(usage: Iterable[ClientUsage]) -> list[tuple[str, ...]]:
    """The table's text cells: client, requests, prompt and decode tokens, busy s, mean and max wait s."""
    header = ("CLIENT", "REQ", "PROMPT TOK", "DECODE TOK", "BUSY S", "WAIT MEAN S", "WAIT MAX S")
    rows: list[tuple[str, ...]] = [header]
    for u in usage:
        mean, longest = u.queue_wait_mean_s, u.queue_wait_max_s
        rows.append((
            u.client, str(u.requests), str(u.prompt_tokens), str(u.decode_tokens), f"{u.busy_s:.1f}",
            "—" if mean is None else f"{mean:.2f}", "—" if longest is None else f"{longest:.2f}",
        ))  # fmt: skip
    return rows


def client_summary(usage: ClientUsage) -> str:
    """One line: `aider: 12 requests, 3.4k decode tokens, busy 41 s, waited 0.8 s on average`."""
    line = (
        f"{usage.client}: {usage.requests} request{'' if usage.requests == 1 else 's'}, "
        f"{usage.decode_tokens} decode tokens, "
        f"busy {usage.busy_s:.0f} s"
    )
    mean = usage.queue_wait_mean_s
    if mean is not None:
        line += f", waited {mean:.1f} s on average"
    return line
