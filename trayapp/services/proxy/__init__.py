"""The recording pass-through proxy (issue #12): HTTP/1.1 framing, the pump, the recorder tap."""
