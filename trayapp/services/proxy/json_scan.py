"""Pure scanning helpers for the recording proxy's tap (#12): no I/O, and no text kept.

Two paths read the same facts from a JSON line or document:

* `scan_line` (fast): a whole line at once; one regex says whether it carries generated text, a cheap
  marker check decides whether `json.loads` is worth running for its statistics.
* `JsonScan` (incremental): the same facts fed in pieces, for a line split across reads or a
  non-streaming body. It tracks only the JSON structure and the values of a few statistics keys;
  string contents are skipped, never stored.

Both report "has text" when a string value under one of `TEXT_KEYS` is non-empty (at any depth: a
role-only delta, `"content":null`, `"content":""` and llama-server's `prompt_progress` chunks do not
count; tool-call `arguments` strings do), and capture the top-level values of `WANTED_KEYS` (and
those under a top-level `response` or `result` object, as `/v1/responses` events and LM Studio's
`chat.end` nest them), the first model name winning.
"""

from __future__ import annotations

import json
import re
from typing import Any

TEXT_KEYS = frozenset(
    {"content", "reasoning_content", "reasoning", "text", "response", "delta", "thinking", "arguments"}
)
STAT_KEYS = frozenset(
    {
        "timings",  # llama-server
        "usage",  # OpenAI-compatible (and /v1/responses' response.usage)
        "stats",  # LM Studio native APIs
        "metrics",  # vLLM per-request metrics block
        "prompt_eval_count",  # Ollama's final object (the durations ride with it)
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
        "load_duration",
        "total_duration",
    }
)
WANTED_KEYS = STAT_KEYS | {"model", "model_instance_id", "load_time_seconds"}
# Why the answer ended, read at any depth (OpenAI nests `finish_reason` in `choices`): scalars only.
STOP_KEYS = frozenset({"finish_reason", "done_reason", "stop_type", "truncated"})
NESTS = frozenset({"response", "result"})  # /v1/responses events, LM Studio's chat.end
MAX_CAPTURE_BYTES = 64 * 1024  # a statistics value larger than this is not statistics: dropped

_TEXT_RE = re.compile(rb'"(?:' + b"|".join(k.encode() for k in sorted(TEXT_KEYS)) + rb')"\s*:\s*"(?!")')
_STAT_RE = re.compile(
    rb'"(?:timings|usage|stats|metrics|prompt_eval_count|prompt_eval_duration|eval_count'
    rb'|eval_duration|load_duration|total_duration|load_time_seconds)"\s*:'
)
_MODEL_RE = re.compile(rb'"model(?:_instance_id)?"\s*:')
_MODEL_STRING_RE = re.compile(rb'"(model(?:_instance_id)?)"\s*:\s*"([^"\\\x00-\x1f]{1,256})"')
_STOP_VALUE_RE = re.compile(
    rb'"(finish_reason|done_reason|stop_type|truncated)"\s*:\s*("[a-z_]{1,32}"|true|false)'
)
_MODEL_KEYS = ("model", "model_instance_id")
_STR_STOP = re.compile(rb'["\\]')
_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN = frozenset(b"{[")
_CLOSE = frozenset(b"}]")


def wants_model(found: dict[str, Any]) -> bool:
    """Whether lines should still be read for a model name (none seen yet)."""
    return found.keys().isdisjoint(_MODEL_KEYS)


def merge_found(found: dict[str, Any], new: dict[str, Any]) -> None:
    """Fold one line's captured values into the request's: later values win, except model names."""
    for key, value in new.items():
        if key in _MODEL_KEYS and key in found:
            continue
        found[key] = value


def _wanted_of(obj: Any, want_model: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not isinstance(obj, dict):
        return out
    for key, value in obj.items():
        if key in NESTS and isinstance(value, dict):
            for sub_key, sub_value in value.items():
                if sub_key in WANTED_KEYS and (
                    sub_key not in _MODEL_KEYS or (want_model and sub_key not in out)
                ):
                    out[sub_key] = sub_value
        elif key in WANTED_KEYS and (key not in _MODEL_KEYS or (want_model and key not in out)):
            out[key] = value
    return out


def _plain_model_names(payload: bytes) -> dict[str, Any] | None:
    """The model names of a line without statistics when each is a plain string (no escapes), read by
    a regex: json.loads cost a stream's first line ~0.1 ms cold, in the way of the first token behind
    it (issue #26). None: one is not plain (json.loads reads it). A key in unescaped quotes is never
    inside a string; a model name is the one thing with that key at any depth."""
    names: dict[str, Any] = {}
    for match in _MODEL_STRING_RE.finditer(payload):
        names.setdefault(match.group(1).decode("ascii"), match.group(2).decode("utf-8", "replace"))
    return names if len(names) == len(_MODEL_RE.findall(payload)) else None


def _stops_of(payload: bytes) -> dict[str, Any]:
    """`STOP_KEYS` at any depth of one line: a key in unescaped quotes is never inside a string."""
    found: dict[str, Any] = {}
    for match in _STOP_VALUE_RE.finditer(payload):
        key = match.group(1).decode("ascii")
        value = match.group(2)
        if value.startswith(b'"'):
            found[key] = value[1:-1].decode("ascii", "replace")
        else:
            found[key] = value == b"true"
    return found


def scan_line(payload: bytes, *, want_model: bool) -> tuple[bool, dict[str, Any]]:
    """One whole JSON line → (carries generated text, captured statistics). Nothing is kept."""
    has_text = _TEXT_RE.search(payload) is not None
    stops = _stops_of(payload)
    if _STAT_RE.search(payload) is None:
        if not want_model or _MODEL_RE.search(payload) is None:
            return has_text, stops
        names = _plain_model_names(payload)
        if names is not None:  # a stream's first line (vLLM's role-only chunk) read without json.loads
            return has_text, {**stops, **names}
    try:
        obj = json.loads(payload)
    except ValueError:
        return has_text, stops
    return has_text, {**stops, **_wanted_of(obj, want_model)}


class JsonScan:
    """Incremental scan of one JSON document (or several in a row) fed in pieces.

    Holds the container stack, the current key names (short schema names, capped) and the raw bytes
    of a statistics value being captured; string values are skipped unread.
    """

    __slots__ = (
        "_cap",
        "_cap_depth",
        "_cap_key",
        "_esc",
        "_expect_key",
        "_in_str",
        "_is_key",
        "_key",
        "_keys",
        "_stack",
        "_text_probe",
        "found",
        "has_text",
        "want_model",
    )

    def __init__(self, *, want_model: bool) -> None:
        self._stack: list[int] = []
        self._keys: list[str] = []
        self._in_str = False
        self._esc = False
        self._is_key = False
        self._key = bytearray()
        self._expect_key = False
        self._text_probe = False
        self._cap: bytearray | None = None
        self._cap_key = ""
        self._cap_depth = 0
        self.want_model = want_model
        self.has_text = False
        self.found: dict[str, Any] = {}

    def _wants(self, key: str) -> bool:
        if key in STOP_KEYS:
            return True
        if key not in WANTED_KEYS or (key in _MODEL_KEYS and (not self.want_model or key in self.found)):
            return False
        depth = len(self._stack)
        return depth == 1 or (depth == 2 and self._keys[0] in NESTS)

    def _end_capture(self, tail: bytes) -> None:
        cap = self._cap
        self._cap = None
        if cap is None or len(cap) + len(tail) > MAX_CAPTURE_BYTES:
            return
        try:
            value = json.loads(bytes(cap + tail))
        except ValueError:
            return
        if value is None and self._cap_key in STOP_KEYS:
            return  # a stream's `"finish_reason": null` before the last chunk names it
        merge_found(self.found, {self._cap_key: value})

    def feed(self, data: bytes) -> None:
        """Scan the next piece of the document."""
        i, n = 0, len(data)
        cap_start = 0
        while i < n:
            if self._in_str:
                if self._esc:
                    self._esc = False
                    i += 1
                    continue
                if self._text_probe:
                    self._text_probe = False
                    if data[i] != _QUOTE:
                        self.has_text = True
                m = _STR_STOP.search(data, i)
                stop = n if m is None else m.start()
                if self._is_key and len(self._key) < 64:
                    self._key += data[i : min(stop, i + 64)]
                if m is None:
                    i = n
                    break
                if data[stop] == _BACKSLASH:
                    if self._is_key and len(self._key) < 64:
                        self._key.append(_BACKSLASH)
                    self._esc = True
                    i = stop + 1
                    continue
                self._in_str = False
                if self._is_key:
                    self._keys[-1] = self._key.decode("utf-8", "replace")
                    self._key.clear()
                i = stop + 1
                continue
            c = data[i]
            if c == _QUOTE:
                self._in_str = True
                self._is_key = self._expect_key and bool(self._stack) and self._stack[-1] == 0x7B
                if (
                    not self._is_key
                    and self._stack
                    and self._stack[-1] == 0x7B
                    and self._keys[-1] in TEXT_KEYS
                ):
                    if i + 1 < n:
                        if data[i + 1] != _QUOTE:
                            self.has_text = True
                    else:
                        self._text_probe = True
            elif c == 0x3A:  # ':'
                self._expect_key = False
                if (
                    self._cap is None
                    and self._stack
                    and self._stack[-1] == 0x7B
                    and self._wants(self._keys[-1])
                ):
                    self._cap = bytearray()
                    self._cap_key = self._keys[-1]
                    self._cap_depth = len(self._stack)
                    cap_start = i + 1
            elif c == 0x2C or c in _CLOSE:  # ',' '}' ']'
                if self._cap is not None and len(self._stack) == self._cap_depth:
                    self._end_capture(data[cap_start:i])
                if c == 0x2C:
                    self._expect_key = bool(self._stack) and self._stack[-1] == 0x7B
                elif self._stack:
                    self._stack.pop()
                    self._keys.pop()
                    self._expect_key = False
            elif c in _OPEN:
                self._stack.append(c)
                self._keys.append("")
                self._expect_key = c == 0x7B
            i += 1
        if self._cap is not None:
            if len(self._cap) + (n - cap_start) > MAX_CAPTURE_BYTES:
                self._cap = None
            else:
                self._cap += data[cap_start:n]


# --------------------------------------------------------------------------- the record
