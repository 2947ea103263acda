"""The one log format rule: no secret reaches a log line or a terminal."""

from __future__ import annotations

import logging

from trayapp.core.redact import redact


class RedactingFormatter(logging.Formatter):
    """Every log line through `redact`, its traceback included: whatever a message interpolates
    (an endpoint URL with credentials, an exception quoting a header), no secret reaches a log."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))
