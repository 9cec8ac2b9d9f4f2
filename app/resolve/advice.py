"""What a node should load with: the engine or tensorizer's reader, and how many readers.

The resolve answer's ``engine`` block, from what the node reports (``gpu``, ``cpu_count``):

- ``loader`` is ``engine`` when the artifact has a layout manifest (``tensors.layout.json``)
  and is not encrypted; otherwise ``tensorizer`` (the engine falls back to it anyway).
- ``connections``: parallel HTTP range connections (or pread threads for a local file). A
  node's copies out of the socket or the page cache are CPU work, so one per core, at least 4
  (connections also hide round trips) and at most 32.
- ``block_bytes``: 64 MiB, the block each connection fetches and each copy moves (large enough
  to amortise a request, small enough that 2 x connections of them stay pinned cheaply).
- ``register_fraction``: on GPU nodes, the share of a local (node cache) file that is pinned
  in place with cudaHostRegister and copied without a CPU copy while readers pread the rest
  (bench/results/engine.md measured the split on an H200); 0 on CPU nodes.
- ``verify``: chunk digests are checked; the engine's cost for that is small enough that
  there is no reason to advise otherwise (``verify_hash=false`` turns it off as well).

Nodes that report nothing get the advice for an unknown 8-core CPU node.
"""

from __future__ import annotations

from typing import Any

from app.client.layout import LAYOUT_FILE
from app.client.manifest import MANIFEST_FILE

BLOCK_BYTES = 64 << 20
UNKNOWN_CORES = 8
MIN_CONNECTIONS = 4
MAX_CONNECTIONS = 32
# The split measured best across six H200 hosts (bench/results/engine.md): 0.65-0.7 on the first
# two, 0 on the third; on the last three (runs 6-8, every split side by side, pinning slices
# of 512 MiB) a fixed 0.5 was the steadiest verified: 38.0-42.4 GB/s against 36.3-40.0 for
# the rest. Chunk digests run on the GPU, so one split serves verified and unverified loads.
GPU_REGISTER_FRACTION = 0.5


def file_kind(path: str, weights_suffix: str) -> str:
    if path == LAYOUT_FILE:
        return "layout"
    if path == MANIFEST_FILE:
        return "manifest"
    return "weights" if path.endswith(weights_suffix) else "config"


def engine_advice(
    *,
    paths: list[str],
    encrypted: bool,
    cpu_count: int | None,
    gpu: bool | None,
    verify: bool,
) -> dict[str, Any]:
    has_layout = LAYOUT_FILE in paths
    cores = cpu_count or UNKNOWN_CORES
    return {
        "loader": "engine" if has_layout and not encrypted else "tensorizer",
        "layout_path": LAYOUT_FILE if has_layout else None,
        "connections": max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, cores)),
        "block_bytes": BLOCK_BYTES,
        "register_fraction": GPU_REGISTER_FRACTION if gpu else 0.0,
        "verify": verify,
    }
