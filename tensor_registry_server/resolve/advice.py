"""What a node should load with: the engine or tensorizer's reader, and how many readers.

The resolve answer's ``engine`` block, from what the node reports (``gpu``, ``cpu_count``):

- ``loader`` is ``engine`` when the artifact has a layout manifest (``tensors.layout.json``)
  and is not encrypted; otherwise ``tensorizer`` (the engine falls back to it anyway).
- ``connections``: parallel HTTP range connections (or pread threads for a local file). A
  node's copies out of the socket or the page cache are CPU work, so one per core on CPU
  nodes, at least 4 (connections also hide round trips) and at most 32. GPU nodes leave a
  quarter of their cores to the thread that pins file pages, the copy submissions and the
  digests: on a 16-core H200 host 10-12 readers beat 16 by 4-7 GB/s on a node-cache load, and
  12 connections beat 16 and 24 on a signed URL (bench/RESULTS.md). The
  CUDA engine's URL readers each keep a second connection on which the next span is asked for
  while the current one ends; the reader reads one of them at a time.
- ``block_bytes``: 64 MiB, the block each connection receives from a signed URL (large enough
  to amortise a receive, small enough that 2 x connections of them stay pinned cheaply). A
  node-cache file is read in the engine's own blocks (8 MiB when nothing is pinned:
  tensor_registry/engine/cuda.py ``FILE_BLOCK_BYTES``).
- ``register_fraction``: on GPU nodes, the share of a local (node cache) file that is pinned
  in place with cudaHostRegister and copied without a CPU copy while readers pread the rest
  (bench/RESULTS.md measured the split on an H200); 0 on CPU nodes.
- ``verify``: chunk digests are checked; the engine's cost for that is small enough that
  there is no reason to advise otherwise (``verify_hash=false`` turns it off as well).

Nodes that report nothing get the advice for an unknown 8-core CPU node.
"""

from __future__ import annotations

from typing import Any

from tensor_registry.formats.layout import LAYOUT_FILE
from tensor_registry.formats.signed_manifest import MANIFEST_FILE, SIGNATURE_FILE

BLOCK_BYTES = 64 << 20
UNKNOWN_CORES = 8
MIN_CONNECTIONS = 4
MAX_CONNECTIONS = 32
# The split between pinning the node-cache file in place and the pread ring (bench/results/
# engine.md): with 16 readers the verified means of fixed 0.5, balanced and pinning only over
# ten H200 hosts were 38.2 / 38.8 / 39.0 GB/s, equal within the spread; with 10-12 readers
# fixed 0.5 reached 42.9-45.9 verified in a warm process against 37.0-40.1 for
# pinning only. But the ring it needs costs a fresh process (every vLLM rank) ≈ 0.3 s per GB
# even as registered anonymous memory (faulting fresh pages in; cudaHostAlloc ≈ 0.45): in vLLM
# a node-cache load took 0.51 s with 0.5 against 0.24 s with 1.0. Pinning all of the
# file needs no ring at all, so 1.0 stays the advice.
GPU_REGISTER_FRACTION = 1.0
# The share of a GPU node's cores that read (the rest pin, submit copies and hash).
GPU_READER_SHARE = 0.75


def file_kind(path: str, weights_suffix: str) -> str:
    if path == LAYOUT_FILE:
        return "layout"
    if path == MANIFEST_FILE:
        return "manifest"
    if path == SIGNATURE_FILE:
        return "signature"
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
    readers = int(cores * GPU_READER_SHARE) if gpu else cores
    return {
        "loader": "engine" if has_layout and not encrypted else "tensorizer",
        "layout_path": LAYOUT_FILE if has_layout else None,
        "connections": max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, readers)),
        "block_bytes": BLOCK_BYTES,
        "register_fraction": GPU_REGISTER_FRACTION if gpu else 0.0,
        "verify": verify,
    }
