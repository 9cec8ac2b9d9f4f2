"""The one parser of safetensors headers (no torch): finalize and the workers both use it.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data buffer, which the
header's `data_offsets` must cover exactly (no gaps, no overlap, nothing after). Only the header
is read, so checking a multi-GB checkpoint stays cheap. Callers turn `HeaderError` into their
own error (finalize: a `corrupt_weights` problem; the worker: a `ModelSourceError`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Collection
from dataclasses import dataclass

from tensor_registry_server.core import bounded_json

# Element width in bits for every dtype tag safetensors writes (sub-byte float formats included).
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
}

# safetensors dtype tags in the torch spelling artifacts use ("float16", not "F16").
DTYPE_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
    "F6_E2M3": "float6_e2m3",
    "F6_E3M2": "float6_e3m2",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "I64": "int64",
    "U64": "uint64",
    "F64": "float64",
    "C64": "complex64",
}


class HeaderError(ValueError):
    """The header is unusable; the message says why (without the file's name)."""


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name -> (dtype tag, shape)
    data_bytes: int
    header_bytes: int
    parameter_count: int

    def dtype_breakdown(self) -> dict[str, dict[str, int]]:
        """Per safetensors dtype: how many tensors, parameters and bytes."""
        out: dict[str, dict[str, int]] = {}
        for dtype, shape in self.tensors.values():
            count = math.prod(shape)
            entry = out.setdefault(dtype, {"tensors": 0, "parameters": 0, "bytes": 0})
            entry["tensors"] += 1
            entry["parameters"] += count
            entry["bytes"] += count * DTYPE_BITS[dtype] // 8
        return out


def header_length(prefix: bytes, *, file_size: int, max_bytes: int) -> int:
    """The header length from the file's first 8 bytes, checked against the file and a cap."""
    if len(prefix) < 8 or file_size < 8:
        raise HeaderError("file shorter than the 8-byte safetensors header length")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length <= 1:
        raise HeaderError(f"implausible safetensors header length {length}")
    if length > max_bytes:
        raise HeaderError(
            f"safetensors header of {length} bytes is over this registry's limit of {max_bytes}"
        )
    if 8 + length > file_size:
        raise HeaderError("header length runs past the end of the file")
    return int(length)


def parse_header(
    raw: bytes, *, file_size: int, dtypes: Collection[str] = DTYPE_BITS.keys()
) -> SafetensorsHeader:
    """Parse the JSON header `raw` of a file of `file_size` bytes; `dtypes` are the tags the
    caller accepts (a known tag outside them is refused as such)."""
    try:
        header = bounded_json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HeaderError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")

    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans: list[tuple[int, int, str]] = []
    parameter_count = 0
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict):
                raise HeaderError("__metadata__ is not an object")
            continue
        if not isinstance(entry, dict):
            raise HeaderError(f"entry {name!r} is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise HeaderError(f"tensor {name!r} has unknown dtype {dtype!r}")
        if dtype not in dtypes:
            raise HeaderError(f"tensor {name!r} has dtype {dtype}, which is not accepted here")
        if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
            raise HeaderError(f"tensor {name!r} has an invalid shape {shape!r}")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            raise HeaderError(f"tensor {name!r} has invalid data_offsets {offsets!r}")
        numel = math.prod(shape)
        nbits = numel * DTYPE_BITS[dtype]
        if nbits % 8 or nbits // 8 != offsets[1] - offsets[0]:
            raise HeaderError(
                f"tensor {name!r} ({dtype} {shape}) needs {nbits / 8:g} bytes"
                f" but its offsets span {offsets[1] - offsets[0]}"
            )
        tensors[name] = (dtype, tuple(shape))
        spans.append((offsets[0], offsets[1], name))
        parameter_count += numel

    data_bytes = file_size - 8 - len(raw)
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise HeaderError(
                f"tensor {name!r} starts at {begin}, expected {position} (gap/overlap)"
            )
        position = end
    if position != data_bytes:
        raise HeaderError(
            f"tensors cover {position} data bytes but the file holds {data_bytes}"
            + (" (truncated?)" if position > data_bytes else " (trailing bytes)")
        )
    return SafetensorsHeader(
        tensors=tensors,
        data_bytes=data_bytes,
        header_bytes=len(raw),
        parameter_count=parameter_count,
    )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
