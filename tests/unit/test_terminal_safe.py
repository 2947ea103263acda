"""What the commands print cannot drive the terminal (#25): a server's strings are shown, not obeyed."""

from __future__ import annotations

import pytest

from trayapp.core.terminal import terminal_safe


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # retitle the terminal
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear the screen
        ("\x1b]52;c;ZXZpbA==\x07", "\\x1b]52;c;ZXZpbA==\\x07"),  # OSC 52: write the clipboard
        ("ok\rfake", "ok\\x0dfake"),  # a carriage return overwriting the line
        ("\x9b31m", "\\x9b31m"),  # an 8-bit CSI
        ("model\u202egguf", "model\\u202egguf"),  # a bidi override reversing what follows
        ("line one\nline two\tcol", "line one\nline two\tcol"),  # newlines and tabs stay
        ("qwen3:30b · 42 tok/s ⚠", "qwen3:30b · 42 tok/s ⚠"),  # ordinary text untouched
    ],
)
def test_control_characters_are_shown_not_obeyed(raw: str, shown: str) -> None:
    assert terminal_safe(raw) == shown
