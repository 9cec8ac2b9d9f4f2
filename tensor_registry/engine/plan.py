"""The engine's defaults from what the node measures: pin a node-cache file in place, or not.

A local file reaches the device two ways (tensor_registry.engine.cuda): reader threads ``preadv``
blocks into the process's pinned ring and copy them, or the file's pages are pinned where they
lie (``cudaHostRegister``) and copied with no CPU copy. Which is faster is the node's:

- pinning runs at the driver's registration rate, serial in the driver, and every other CUDA
  call of the process waits while it runs; on one H100 registering a 7.81 GB file took 0.33 s of
  a 0.40 s load (issue 35), on the hosts of bench/results/engine.md ≈ 25 ms per GB;
- the ring runs at the readers' page-cache copy rate (one core each) up to the DMA rate, but a
  process's first load also pays for the ring itself (fresh anonymous memory faulted in and
  registered: ≈ 0.3 s per GB in a fresh vLLM rank).

So :func:`measure` times, once per process, device and file system, on the file itself: a
``cudaHostRegister`` of its first pages (``probe_bytes``), the copy of those pinned pages to the
device, one reader's ``preadv`` of the next ones, and one ring buffer made the ring's way; and
:func:`choose` extrapolates both ways to the whole file and takes the faster (pinning all of it,
or the ring alone: runs 6-13 and 48-49 found the fixed splits no faster than the better end).
A ring this process already holds costs nothing. ``LoadOptions.register_fraction`` set by the
caller skips all this.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from tensor_registry.engine import pinned
from tensor_registry.engine.copies import runtime

PROBE_BYTES = 32 << 20
READ_PROBE_BYTES = 16 << 20


@dataclass(frozen=True)
class NodeRates:
    """What the probe measured, in GB/s (``ring_gbps``: making fresh ring memory, the
    populate threads together), the file system and the usable cores."""

    register_gbps: float
    dma_gbps: float
    read_gbps: float
    ring_gbps: float
    filesystem: str
    cores: int
    probe_s: float


@dataclass(frozen=True)
class Choice:
    register_fraction: float
    pin_s: float  # the whole file pinned in place, estimated
    ring_s: float  # the whole file through the ring (and the ring made, if it is not yet)
    ring_ready: bool
    rates: NodeRates

    def phases(self) -> dict[str, Any]:
        return {
            "plan": {
                "register_fraction": self.register_fraction,
                "pin_s": round(self.pin_s, 4),
                "ring_s": round(self.ring_s, 4),
                "ring_ready": self.ring_ready,
                **{
                    k: round(v, 3) if isinstance(v, float) else v
                    for k, v in asdict(self.rates).items()
                },
            }
        }


_measured: dict[tuple[str, int], NodeRates] = {}
_lock = threading.Lock()


def filesystem_of(fd: int) -> str:
    """The type of the file system holding ``fd`` (``/proc/self/mountinfo``), or "unknown"."""
    dev = os.fstat(fd).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and parts[2] == want and "-" in parts:
                    return parts[parts.index("-") + 1]
    except OSError:
        pass
    return "unknown"


def choose(
    size: int, rates: NodeRates, *, readers: int, ring_bytes: int, ring_ready: bool
) -> Choice:
    """Pin all of a ``size``-byte file in place, or read it all through the ring: whichever
    the measured rates say ends first. Pinning and its copies overlap slice by slice, so it
    goes at the slower of registering and DMA; the readers go at their copy rate each, up to
    the DMA rate, after the ring is made (unless this process already has it)."""
    gb = size / 1e9
    pin_s = gb / max(1e-3, min(rates.register_gbps, rates.dma_gbps))
    ring_rate = min(rates.dma_gbps, max(1, readers) * rates.read_gbps)
    make_ring = 0.0 if ring_ready else ring_bytes / 1e9 / max(1e-3, rates.ring_gbps)
    ring_s = gb / max(1e-3, ring_rate) + make_ring
    fraction = 1.0 if pin_s < ring_s else 0.0
    return Choice(fraction, pin_s, ring_s, ring_ready, rates)


def measure(fd: int, size: int, device: Any, *, probe_bytes: int = PROBE_BYTES) -> NodeRates:
    """The node's rates for files on ``fd``'s file system (measured once per process, device and
    file system; the probe costs ≈ 10 ms)."""
    key = (str(device), os.fstat(fd).st_dev)
    with _lock:
        known = _measured.get(key)
        if known is None:
            known = _measured[key] = _probe(fd, size, device, probe_bytes)
        return known


def _probe(fd: int, size: int, device: Any, probe_bytes: int) -> NodeRates:
    import torch

    started = time.perf_counter()
    page = mmap.PAGESIZE
    length = max(page, min(probe_bytes, size // 2) // page * page)
    rt = runtime()
    if rt is None:
        raise RuntimeError("the CUDA runtime library (libcudart) was not found")
    stream = torch.cuda.Stream(device).cuda_stream
    # cudaHostRegister of the file's first pages, as the pinning thread does its slices.
    registered = pinned.RegisteredFile(fd, 0, length)
    try:
        t = time.perf_counter()
        registered.pin(0, length)
        register_s = time.perf_counter() - t
        dest = torch.empty(length, dtype=torch.uint8, device=device)
        dma_s = float("inf")
        for _ in range(2):  # the first copy also sets the path up
            t = time.perf_counter()
            rt.copy(dest.data_ptr(), registered.address(0), length, stream)
            rt.sync(stream)
            dma_s = min(dma_s, time.perf_counter() - t)
        del dest
    finally:
        registered.close()
    # One reader's preadv out of the page cache into memory already faulted in.
    read_length = min(READ_PROBE_BYTES, max(page, (size - length) // page * page))
    buffer = mmap.mmap(-1, read_length)
    buffer.write(b"\0" * read_length)
    offset = length if size - length >= read_length else 0
    t = time.perf_counter()
    got = os.preadv(fd, [buffer], offset)
    read_s = time.perf_counter() - t
    buffer.close()
    # One ring buffer made the ring's way (fresh memory faulted in on the populate threads,
    # then registered), then given back.
    ring_length = 8 << 20
    ring_s = pinned.time_fresh_buffer(ring_length)
    return NodeRates(
        register_gbps=length / 1e9 / max(1e-6, register_s),
        dma_gbps=length / 1e9 / max(1e-6, dma_s),
        read_gbps=max(1, got) / 1e9 / max(1e-6, read_s),
        # No registered ring here (torch's pinned allocator instead): count it slow.
        ring_gbps=ring_length / 1e9 / max(1e-6, ring_s) if ring_s is not None else 0.01,
        filesystem=filesystem_of(fd),
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1,
        probe_s=time.perf_counter() - started,
    )
