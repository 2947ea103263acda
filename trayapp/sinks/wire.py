"""The wire form of the sampler's POST endpoints: a dataclass as its own fields in JSON, and back,
checked field by field (unknown fields, wrong types, negatives where none belong and NaN refused).
Used by `sampler_file` (the client) and `snapshot_server` (the endpoint)."""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from trayapp.core.model import FinishedRequest

T = TypeVar("T")
MAX_RECORDS = 500  # records in one post, at most
MAX_UPSTREAMS = 16  # servers one proxy names, at most
MAX_LEASE_S = 300.0  # a proxy's servers count as proxied at most this long after its post
MAX_TEXT_CHARS = 1000  # any string in a record (model names, URLs, labels, a bench's warnings)


class WireError(ValueError):
    """A posted document that is not what the endpoint takes (the message says what is wrong)."""


def _finite(value: Any) -> Any:
    """JSON-ready: NaN and infinities as null, tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def to_wire(value: Any) -> dict[str, Any]:
    """A dataclass (FinishedRequest, BenchResult) as the JSON object the endpoint takes."""
    return dict(_finite(dataclasses.asdict(value)))


def from_wire(cls: type[T], value: Any, where: str = "") -> T:
    """Rebuild `cls` from its wire form, strictly: every required field present, no unknown one,
    each of its declared type (numbers finite and ≥ 0, strings at most MAX_TEXT_CHARS); raises
    WireError naming the first field that is wrong."""
    return cast(T, _build(cls, value, where or cls.__name__))


def _build(hint: Any, value: Any, where: str) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return value  # free-form detail (a bench's hardware): bounded by the body's size
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise WireError(f"{where}: missing (null)")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _build(option, value, where)
            except WireError as exc:
                errors.append(str(exc))
        raise WireError(errors[0])
    if origin is Literal:
        if isinstance(value, str) and value in get_args(hint):
            return value
        raise WireError(f"{where}: one of {', '.join(map(str, get_args(hint)))}")
    if origin is tuple:
        if not isinstance(value, list):
            raise WireError(f"{where}: a list")
        item = get_args(hint)[0]
        return tuple(_build(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise WireError(f"{where}: an object")
        item = get_args(hint)[1]
        return {str(k): _build(item, v, f"{where}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise WireError(f"{where}: true or false")
    if hint is int or hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0 or (hint is int and not isinstance(value, int)):
            raise WireError(f"{where}: a {'whole ' if hint is int else ''}number ≥ 0")
        return float(value) if hint is float else value
    if hint is str:
        if isinstance(value, str) and len(value) <= MAX_TEXT_CHARS:
            return value
        raise WireError(f"{where}: a string of at most {MAX_TEXT_CHARS} characters")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build_dataclass(hint, value, where)
    raise WireError(f"{where}: not accepted")  # a type this wire form does not carry


def _build_dataclass(cls: type[Any], value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise WireError(f"{where}: an object")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise WireError(f"{where}: unknown field {unknown[0]!r}")
    hints = get_type_hints(cls)
    kwargs = {}
    for name, field in fields.items():
        if name not in value:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise WireError(f"{where}.{name}: missing")
            continue
        kwargs[name] = _build(hints[name], value[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise WireError(f"{where}: {exc}") from None


def parse_records(body: Any) -> tuple[list[str], float, list[tuple[str, FinishedRequest]]]:
    """A POST /v1/records body → (upstreams, lease_s, [(upstream, record)]); raises WireError.

    `{"upstreams": [url, ...], "lease_s": 30, "records": [{"upstream": url, "request": {...}}]}`:
    each request is a FinishedRequest in its wire form, `source` "proxy", of one of `upstreams`.
    """
    if not isinstance(body, dict):
        raise WireError("an object with upstreams, lease_s and records")
    unknown = sorted(set(body) - {"upstreams", "lease_s", "records"})
    if unknown:
        raise WireError(f"unknown field {unknown[0]!r}")
    upstreams = body.get("upstreams")
    if not isinstance(upstreams, list) or not 1 <= len(upstreams) <= MAX_UPSTREAMS:
        raise WireError(f"upstreams: a list of 1 to {MAX_UPSTREAMS} server URLs")
    for i, url in enumerate(upstreams):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 512:
            raise WireError(f"upstreams[{i}]: an http(s) URL")
    lease_s = body.get("lease_s")
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not 0 <= lease_s <= MAX_LEASE_S:
        raise WireError(f"lease_s: seconds, 0 to {MAX_LEASE_S:g}")
    items = body.get("records")
    if not isinstance(items, list) or len(items) > MAX_RECORDS:
        raise WireError(f"records: a list of at most {MAX_RECORDS}")
    records: list[tuple[str, FinishedRequest]] = []
    for i, item in enumerate(items):
        where = f"records[{i}]"
        if not isinstance(item, dict) or set(item) != {"upstream", "request"}:
            raise WireError(f"{where}: an object with upstream and request")
        if item["upstream"] not in upstreams:
            raise WireError(f"{where}.upstream: one of upstreams")
        record = from_wire(FinishedRequest, item["request"], f"{where}.request")
        if record.source != "proxy":
            raise WireError(f"{where}.request.source: must be proxy (only a proxy's records are taken)")
        if not record.model:
            raise WireError(f"{where}.request.model: missing")
        records.append((item["upstream"], record))
    return list(upstreams), float(lease_s), records
