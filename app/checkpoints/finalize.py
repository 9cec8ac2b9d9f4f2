"""Finalize-time checks on a version's files, reading only what is needed.

config.json must parse and name an architecture; there must be safetensors weights; each
safetensors header must parse and describe exactly the bytes the file holds
(app.checkpoints.safetensors, with `ACCEPTED_DTYPES`). Only headers are read (8 bytes + the
JSON header), so finalize stays cheap for multi-GB checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app import bounded_json
from app.checkpoints.safetensors import SafetensorsHeader

# The dtype tags finalize accepts: every whole-byte tag but F8_E8M0 and C64, as before the
# parsers were merged. The worker's parser (huggingface.py) also reads those and the sub-byte
# floats (F4, F6_*); this set keeps finalize as strict as it was.
ACCEPTED_DTYPES = frozenset(
    {
        "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3",
        "F8_E5M2", "U16", "U32", "U64",
    }
)  # fmt: skip


@dataclass
class Problem:
    path: str | None
    code: str
    message: str


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
