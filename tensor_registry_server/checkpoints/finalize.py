"""Finalize-time checks on a version's files, reading only what is needed.

config.json must parse and name an architecture (the rules are
``tensor_registry_server.checkpoints.huggingface.parse_config``, shared with the worker); there
must be safetensors
weights; each safetensors header must parse and describe exactly the bytes the file holds
(tensor_registry_server.checkpoints.safetensors, with `ACCEPTED_DTYPES`). Only headers are read (8
bytes + the
JSON header), so finalize stays cheap for multi-GB checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensor_registry_server.checkpoints.huggingface import ModelSourceError, parse_config
from tensor_registry_server.checkpoints.safetensors import SafetensorsHeader

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
    # auto_map and *.py files (checkpoints.pickles.remote_code); None: no executable content.
    remote_code: dict[str, Any] | None = None

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
    """config.json checked by the one set of rules (``huggingface.parse_config``), its refusal
    reported as this file's problem rather than raised: finalize lists every problem at once."""
    try:
        return parse_config(raw), None
    except ModelSourceError as exc:
        return None, Problem(path, exc.code, exc.message)
