"""Limits on JSON from another process (docs/security.md): checked on the text, before parsing.

`json.loads` builds a Python object per value (7 MB of `{}` is ~200 MB of dicts) and recurses per level
of nesting (a deep enough answer is a RecursionError). `json_problem` scans the text in linear time,
with no object per value, and says why it must not be parsed. Used by every reader of another
process's JSON: sources/http.py (servers, remote agents) and sinks/snapshot_server.py (posted records).
"""

from __future__ import annotations

import re

MAX_JSON_DEPTH = 64  # nesting of arrays and objects (the deepest real answer: ~8)
MAX_JSON_VALUES = 200_000  # values in one document (Ollama's /api/tags of 1000 models: ~30k)

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_problem(text: str, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES) -> str | None:
    """Why `text` must not be parsed (too deeply nested, too many values), or None: a scan of the text
    in linear time, with no Python object per value."""
    bare = _JSON_STRING.sub('""', text) if '"' in text else text  # brackets and commas in strings count not
    opens = bare.count("[") + bare.count("{")
    if opens + bare.count(",") + 1 > max_values:  # first: it bounds the nesting scan below
        return f"answer too large (over {max_values} JSON values)"
    if opens > max_depth:
        brackets = _NOT_BRACKET.sub("", bare)
        for _ in range(max_depth):  # each pass takes away the innermost level
            shorter = brackets.replace("[]", "").replace("{}", "")
            if shorter == brackets or not shorter:  # done (or mismatched: json.loads says so)
                brackets = shorter
                break
            brackets = shorter
        if "[]" in brackets or "{}" in brackets:
            return f"answer too deeply nested (JSON over {max_depth} levels)"
    return None
