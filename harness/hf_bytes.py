"""Byte-level builders that need no torch (safetensors files written by hand)."""

from __future__ import annotations

import json
import struct


def tiny_safetensors(values: int = 16) -> bytes:
    """A valid safetensors file with one float32 tensor of ``values`` elements."""
    data = b"".join(struct.pack("<f", float(i)) for i in range(values))
    header = json.dumps(
        {"weight": {"dtype": "F32", "shape": [values], "data_offsets": [0, len(data)]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data
