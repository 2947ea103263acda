"""The config file's list sections (`[[endpoints]]`, `[[proxies]]`, `[[agents]]`): one parser, one
error model. Each bad entry is reported with its key path (`proxies[1].listen: …`) and skipped; the
other entries still load."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an environment variable's name (token_env, …)


class ConfigError(ValueError):
    """A config file problem, with where it is (line or key path)."""


# build(data, prefix, earlier): one entry from its TOML table, `prefix` its key path ("agents[2]") and
# `earlier` the good entries before it (to refuse a duplicate); raises ConfigError naming the key.
EntryBuilder = Callable[[Any, str, Sequence[T]], T]


def parse_list(section: str, value: Any, build: EntryBuilder[T], errors: list[str]) -> tuple[T, ...]:
    """The good entries of `[[section]]`; each bad one's message is appended to `errors`."""
    if not isinstance(value, list):
        errors.append(f"{section}: expected a list of [[{section}]] tables")
        return ()
    good: list[T] = []
    for index, item in enumerate(value):
        try:
            good.append(build(item, f"{section}[{index}]", good))
        except ConfigError as exc:
            errors.append(str(exc))
    return tuple(good)
