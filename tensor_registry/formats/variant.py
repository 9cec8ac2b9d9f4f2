"""The variant of a tensorized artifact, and the one name every door gives it.

A variant is (dtype, format, tensor_parallel_size, encrypted); with a ref in front it names one
artifact of a model: ``prod.bfloat16.hf.tp1``, ``3.float16.vllm.tp2.enc`` (docs/api.md,
"Standard front doors"). A name without the variant suffix is a source ref (a version number,
an alias, ``latest``). Aliases may contain dots, so a name is read from the right: it names a
variant exactly when its last three (or four, with ``.enc``) parts are a dtype, a format and
``tpN``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

# The one spelling of the vocabulary: the API's schemas, the CLI's choices, the worker's torch
# dtypes and the web UI (tensor_registry_server/ui/js/vocabulary.js, generated from here) all
# read it; tests/test_vocabulary.py fails when a copy appears.
Dtype = Literal["float16", "bfloat16", "float32"]
Format = Literal["hf", "vllm"]
DTYPES: tuple[str, ...] = get_args(Dtype)
FORMATS: tuple[str, ...] = get_args(Format)
# Each dtype's short precision name (CNCF ModelPack's config.precision, vLLM's logs).
DTYPE_PRECISION: dict[str, str] = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
# A node asks for at most this many ranks (a bound on a number from a name or a request).
MAX_TENSOR_PARALLEL_SIZE = 1024

_TP_RE = re.compile(r"^tp([1-9][0-9]{0,3})$")


@dataclass(frozen=True)
class Variant:
    dtype: str
    format: str
    tensor_parallel_size: int = 1
    encrypted: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        tp = self.tensor_parallel_size
        if (
            not isinstance(tp, int)
            or isinstance(tp, bool)
            or not 1 <= tp <= MAX_TENSOR_PARALLEL_SIZE
        ):
            raise ValueError(
                f"tensor_parallel_size must be an integer from 1 to {MAX_TENSOR_PARALLEL_SIZE}"
            )

    @property
    def suffix(self) -> str:
        """``bfloat16.hf.tp1`` (``.enc`` appended when encrypted)."""
        name = f"{self.dtype}.{self.format}.tp{self.tensor_parallel_size}"
        return f"{name}.enc" if self.encrypted else name


@dataclass(frozen=True)
class DoorName:
    """What a door's tag or revision names: a source ref, and the variant when it has one."""

    ref: str
    variant: Variant | None = None

    def __str__(self) -> str:
        return self.ref if self.variant is None else f"{self.ref}.{self.variant.suffix}"


def parse_door_name(name: str) -> DoorName:
    """``prod`` → (prod, None); ``3.float16.vllm.tp2.enc`` → (3, Variant(float16, vllm, 2, True)).
    A name that is not a variant name is returned whole as the ref (the caller checks the ref)."""
    parts = name.split(".")
    encrypted = len(parts) >= 5 and parts[-1] == "enc"
    tail = parts[:-1] if encrypted else parts
    if len(tail) >= 4 and tail[-3] in DTYPES and tail[-2] in FORMATS:
        tp = _TP_RE.match(tail[-1])
        ref = ".".join(tail[:-3])
        if tp and ref:
            return DoorName(ref, Variant(tail[-3], tail[-2], int(tp.group(1)), encrypted))
    return DoorName(name)


# The Hub's default branch: the HF door reads it as ``latest``.
HF_DEFAULT_BRANCH = "main"


def door_collision(name: str) -> str | None:
    """Why ``name`` cannot be an alias (one name means one thing in every door), or None: the
    HF door's default branch, or a name of the variant form ``REF.DTYPE.FORMAT.tpN[.enc]``
    (which the doors read as a variant of REF, never as the alias)."""
    if name == HF_DEFAULT_BRANCH:
        return f"'{name}' is the HF door's default branch (it names latest there)"
    door = parse_door_name(name)
    if door.variant is not None:
        return (
            f"'{name}' reads as variant {door.variant.suffix} of '{door.ref}' in the HF and OCI "
            "doors"
        )
    return None


def door_name(ref: str, variant: Variant | None) -> str:
    return str(DoorName(ref, variant))
