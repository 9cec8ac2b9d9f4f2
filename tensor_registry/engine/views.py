"""Tensors out of one buffer: views of a host mapping, or of the one device allocation.

tensorizer does not align tensor data, so a view of a host mapping may start at an odd address:
torch's CPU kernels accept that (``aligned=True`` copies such tensors instead). On a CUDA device
each tensor gets a ``SLOT_ALIGN``-byte aligned slot of one allocation (``slot_plan``), and a block
of file bytes is scattered to the slots it covers (``slot_segments``).

torch is imported inside the functions (the base client installs without it).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tensor_registry.formats import layout as layouts
from tensor_registry.formats.layout import FileLayout

SLOT_ALIGN = 256
VLLM_MARKER = ".vllm_tensorized_marker"


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def tensor_views(
    file: FileLayout, buffer: Any, *, aligned: bool, skip_marker: bool
) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for t in file.tensors:
        if skip_marker and t.name == VLLM_MARKER:
            continue
        dtype = _torch_dtype(t.dtype)
        count = t.nbytes // layouts.ITEM_SIZES[t.dtype]
        if t.data_length == 0:
            out[t.name] = torch.zeros(t.shape, dtype=dtype)
            continue
        view = torch.frombuffer(buffer, dtype=dtype, count=count, offset=t.data_offset)
        if aligned and t.data_offset % view.element_size():
            view = view.clone()
        out[t.name] = view.view(t.shape)
    return out


@dataclass
class SlotPlan:
    """Where each tensor lives in the one device allocation; sorted by file offset."""

    starts: list[int]
    ends: list[int]
    slots: list[int]
    total: int


def slot_plan(file: FileLayout) -> SlotPlan:
    tensors = sorted((t for t in file.tensors if t.data_length), key=lambda t: t.data_offset)
    starts, ends, slots = [], [], []
    cursor = 0
    for t in tensors:
        starts.append(t.data_offset)
        ends.append(t.data_offset + t.data_length)
        slots.append(cursor)
        cursor += (t.data_length + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN
    return SlotPlan(starts, ends, slots, max(cursor, SLOT_ALIGN))


def slot_segments(plan: SlotPlan, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(file offset, device offset, length) of each tensor's bytes inside [start, end)."""
    i = max(0, bisect.bisect_right(plan.starts, start) - 1)
    while i < len(plan.starts) and plan.starts[i] < end:
        a, b = max(start, plan.starts[i]), min(end, plan.ends[i])
        if a < b:
            yield a, plan.slots[i] + (a - plan.starts[i]), b - a
        i += 1


def device_views(
    file: FileLayout, plan: SlotPlan, dest: Any, *, skip_marker: bool
) -> dict[str, Any]:
    import torch

    slot_of = dict(zip(plan.starts, plan.slots, strict=True))
    out: dict[str, Any] = {}
    for t in file.tensors:
        if skip_marker and t.name == VLLM_MARKER:
            continue
        dtype = _torch_dtype(t.dtype)
        if t.data_length == 0:
            out[t.name] = torch.zeros(t.shape, dtype=dtype, device=dest.device)
            continue
        slot = slot_of[t.data_offset]
        out[t.name] = dest[slot : slot + t.data_length].view(dtype).view(t.shape)
    return out
