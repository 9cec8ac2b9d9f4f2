"""Finalize-time checks on a version's files, reading only what is needed.

config.json must parse and name an architecture; there must be safetensors weights; each
safetensors header must parse and describe exactly the bytes the file holds. Only headers are
read (8 bytes + the JSON header), so finalize stays cheap for multi-GB checkpoints.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from app import bounded_json

DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}  # fmt: skip


@dataclass
class Problem:
    path: str | None
    code: str
    message: str


@dataclass
class SafetensorsHeader:
    tensors: dict[str, dict[str, Any]]
    data_bytes: int
    header_bytes: int

    @property
    def parameter_count(self) -> int:
        total = 0
        for info in self.tensors.values():
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            total += count
        return total

    def dtype_breakdown(self) -> dict[str, dict[str, int]]:
        """Per safetensors dtype: how many tensors, parameters and bytes."""
        out: dict[str, dict[str, int]] = {}
        for info in self.tensors.values():
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            entry = out.setdefault(info["dtype"], {"tensors": 0, "parameters": 0, "bytes": 0})
            entry["tensors"] += 1
            entry["parameters"] += count
            entry["bytes"] += count * DTYPE_SIZES[info["dtype"]]
        return out


@dataclass
class ValidationReport:
    problems: list[Problem] = field(default_factory=list)
    architecture: str | None = None
    parameter_count: int = 0
    weight_bytes: int = 0
    dtype_breakdown: dict[str, dict[str, int]] = field(default_factory=dict)

    def add_weights(self, header: SafetensorsHeader) -> None:
        self.parameter_count += header.parameter_count
        self.weight_bytes += header.data_bytes
        for dtype, counts in header.dtype_breakdown().items():
            entry = self.dtype_breakdown.setdefault(
                dtype, {"tensors": 0, "parameters": 0, "bytes": 0}
            )
            for key, value in counts.items():
                entry[key] += value


def check_config(path: str, raw: bytes) -> tuple[dict[str, Any] | None, Problem | None]:
    try:
        config = bounded_json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        return None, Problem(path, "invalid_config", f"config.json is not valid JSON: {exc}")
    if not isinstance(config, dict):
        return None, Problem(path, "invalid_config", "config.json must hold a JSON object")
    architectures = config.get("architectures")
    model_type = config.get("model_type")
    if architectures is not None and not (
        isinstance(architectures, list)
        and all(isinstance(a, str) and a for a in architectures)
    ):
        return None, Problem(
            path, "invalid_config", "config.json `architectures` must be a list of class names"
        )
    if model_type is not None and not isinstance(model_type, str):
        return None, Problem(path, "invalid_config", "config.json `model_type` must be a string")
    if not architectures and not model_type:
        return None, Problem(
            path, "invalid_config", "config.json names neither 'architectures' nor 'model_type'"
        )
    return config, None


def header_length(prefix: bytes, *, max_bytes: int) -> int:
    if len(prefix) < 8:
        raise ValueError("file shorter than the 8-byte safetensors header length")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length <= 1:
        raise ValueError(f"implausible safetensors header length {length}")
    if length > max_bytes:
        raise ValueError(
            f"safetensors header of {length} bytes is over this registry's limit of {max_bytes}"
        )
    return int(length)


def parse_safetensors_header(header: bytes, *, file_size: int) -> SafetensorsHeader:
    """Parse a safetensors JSON header and check it against the file's size."""
    try:
        meta = bounded_json.loads(header)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"header is not JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ValueError("header is not a JSON object")
    tensors = {k: v for k, v in meta.items() if k != "__metadata__"}
    if not all(isinstance(info, dict) for info in tensors.values()):
        raise ValueError("header entries must be JSON objects")
    end = 0
    for name, info in tensors.items():
        try:
            start, stop = (int(x) for x in info["data_offsets"])
            size = DTYPE_SIZES[info["dtype"]]
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"tensor {name!r} has a malformed entry") from exc
        if stop - start != count * size or start < 0:
            raise ValueError(f"tensor {name!r}: offsets do not match dtype and shape")
        end = max(end, stop)
    data_bytes = file_size - 8 - len(header)
    if end != data_bytes:
        raise ValueError(
            f"header describes {end} bytes of tensor data but the file holds {data_bytes}"
        )
    return SafetensorsHeader(tensors=tensors, data_bytes=data_bytes, header_bytes=len(header))
