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
# The split between pinning the node-cache file in place and the pread ring (bench/results/
# engine.md): across ten H200 hosts the verified means of fixed 0.5, balanced and pinning only
# were 38.2 / 38.8 / 39.0 GB/s, equal within the spread; but a fresh process (every vLLM rank)
# pays ≈ 0.47 s per GB of ring it allocates (run 14: 0.38 s for a 12-buffer ring, 1.0-1.25 s
# for 32) and ≈ 0.025 s per GB to pin file pages. Pinning all of it needs no ring at all.
GPU_REGISTER_FRACTION = 1.0


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
