"""Credentials out of text, decided once: URLs (store rows, metric labels, logs, diagnostics), free text."""

from __future__ import annotations

import re

REDACTED = "<redacted>"

_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/@?#]*@)?(?P<rest>[^\s?#]*)(?P<tail>[?#]\S*)?"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_KEY_VALUE = re.compile(
    r"(?i)\b((?:api|access|auth|bearer|refresh|client)?[_-]?(?:key|token|secret|password|passwd))\b"
    r"(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)"
)
_KEY_LIKE = re.compile(r"\b(?:sk|pk|hf|ghp|gho|xox[abp])[-_][A-Za-z0-9_-]{8,}\b")


def redact_url(url: str) -> str:
    """The URL without credentials, query string or fragment."""
    return _URL.sub(lambda m: m.group("scheme") + m.group("rest"), url)


def redact(text: str) -> str:
    """Strip credentials from free text: URL userinfo and queries, bearer tokens, key=value secrets."""
    text = redact_url(text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _KEY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _KEY_LIKE.sub(REDACTED, text)
