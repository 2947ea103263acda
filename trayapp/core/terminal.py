"""Text a terminal may show: what the commands print passes through `terminal_safe` (a tiny module, so
`llm-tray bar` starts fast)."""

from __future__ import annotations

import re

# Control characters (C0 but newline and tab, DEL, C1) and the bidi overrides: a server's model name or
# reason could otherwise move the cursor, clear the screen, retitle the terminal or write the
# clipboard (OSC 52) when `status`, `watch`, `sessions` or `bar` print it.
_NOT_FOR_TERMINALS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """`text` as a terminal may show it: every control character written as `\\xNN` (`\\u202e` for a
    bidi override); newlines and tabs stay. Applied to every text the commands print."""
    return _NOT_FOR_TERMINALS.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text
    )
