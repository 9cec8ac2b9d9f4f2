"""Pinned host memory for CUDA loads: the ring of pinned buffers, file pages pinned in place,
the CUDA runtime called through ctypes, and unpinning off the load's path.

Pinned memory from ``cudaHostAlloc`` (torch's ``pin_memory``) is slow to get: ≈ 0.45 s per GB,
the driver zeroing and pinning it on one thread, paid by the first load of every process. So the
ring is anonymous memory faulted in (zeroed) by several threads and then pinned by one
``cudaHostRegister``, which costs about what registering cached file pages does (≈ 25 ms per
GB); torch's allocator is the fallback. A process keeps its ring between loads, the registration
calls go through ctypes (which releases the GIL while the driver works) and registered file
pages are unpinned on a background thread after the last byte is on the device
(``wait_released``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import threading
import time
from typing import Any

from app.client.engine import pages
from app.client.engine.sources import _FileSource

_CUDA_HOST_REGISTER_READ_ONLY = 8
_CUDA_HOST_REGISTER_PORTABLE = 1


def _host_view(address: int, length: int) -> Any:
    """A CPU uint8 tensor over raw memory (pinned or registered)."""
    import torch

    return torch.frombuffer((ctypes.c_char * length).from_address(address), dtype=torch.uint8)


def _memview(address: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


class _PinnedRing:
    """``count`` pinned host buffers of ``size`` bytes, each with its index (the row of the
    load's device staging buffer that pairs with it, when chunk digests run on the device);
    each handed back with the event of the last copy still reading it, waited for before the
    buffer is refilled."""

    def __init__(self, count: int, size: int) -> None:
        self.count = count
        self.free: queue.SimpleQueue[tuple[Any, int, Any]] = queue.SimpleQueue()
        base = _registered_anonymous(count * size)
        # How the buffers were pinned: "register" (one registered mapping) or "torch".
        self.how = "register" if base is not None else "torch"
        for index in range(count):
            if base is not None:
                host = _host_view(base + index * size, size)
            else:
                import torch

                host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self.free.put((host, index, None))

    def take(self) -> tuple[Any, int]:
        buffer, index, event = self.free.get()
        if event is not None:
            event.synchronize()
        return buffer, index

    def give(self, buffer: Any, index: int, event: Any) -> None:
        self.free.put((buffer, index, event))


POPULATE_THREADS = 8


def _registered_anonymous(length: int) -> int | None:
    """The address of ``length`` bytes of private anonymous memory, faulted in by up to
    :data:`POPULATE_THREADS` threads (``pages.populate``; the kernel zeroes each page, which is
    most of what ``cudaHostAlloc`` spends on one thread) and then pinned by one
    ``cudaHostRegister``; None where that cannot be done (no libc, only torch's binding of the
    runtime, the driver refuses), and the caller allocates through torch instead. The memory
    is kept for the life of the process, as the ring that views it is."""
    libc = pages.libc()
    cudart = _cudart()
    if libc is None or length <= 0 or not hasattr(cudart, "engine_source"):
        return None
    address = libc.mmap(
        None,
        length,
        mmap.PROT_READ | mmap.PROT_WRITE,
        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
        -1,
        0,
    )
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    base = int(address)
    page = mmap.PAGESIZE
    step = -(-length // POPULATE_THREADS // page) * page
    pieces = [(a, min(step, length - (a - base))) for a in range(base, base + length, step)]
    threads = [
        threading.Thread(target=pages.populate, args=piece, kwargs={"write": True})
        for piece in pieces[1:]
    ]
    for thread in threads:
        thread.start()
    pages.populate(*pieces[0], write=True)
    for thread in threads:
        thread.join()
    if int(cudart.cudaHostRegister(base, length, _CUDA_HOST_REGISTER_PORTABLE)) != 0:
        libc.munmap(base, length)
        return None
    return base


_rings: dict[tuple[int, int], _PinnedRing] = {}
_rings_lock = threading.Lock()


def _ring(count: int, size: int) -> _PinnedRing:
    # Pinning host memory is slow: a process keeps its ring between loads.
    # Device staging is allocated per load instead, so a serving process (vLLM sizes its KV
    # cache after the weights) does not keep 2 GiB of device memory for the next load.
    with _rings_lock:
        ring = _rings.get((count, size))
        if ring is None:
            ring = _rings[(count, size)] = _PinnedRing(count, size)
        return ring


_libcudart: Any = None


def _cudart() -> Any:
    """The CUDA runtime torch loaded, called through ctypes: a ctypes call releases the GIL,
    so pinning (≈ 25 ms per GB, serialised in the driver) never stalls the reader threads,
    whose Python steps between preadv calls need the GIL (torch's own binding holds it)."""
    global _libcudart
    if _libcudart is not None:
        return _libcudart
    import glob

    import torch

    torch.cuda.init()
    candidates = ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"]
    roots = {os.path.dirname(os.path.dirname(torch.__file__))}
    for root in roots:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "torch", "lib", "libcudart*.so*")))
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostRegister.restype = ctypes.c_int
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaHostUnregister.restype = ctypes.c_int
        lib.engine_source = name  # type: ignore[attr-defined]
        _libcudart = lib
        return lib
    _libcudart = torch.cuda.cudart()  # no shared library found: torch's binding (holds the GIL)
    return _libcudart


class _Registered:
    """A read-only shared mapping of [start, end) of a file, pinned in slices as it is used."""

    def __init__(self, fd: int, start: int, end: int) -> None:
        libc = pages.libc()
        if libc is None:  # pragma: no cover - CUDA loads run on Linux
            raise OSError("pinning file pages in place needs Linux")
        self.libc = libc
        page = mmap.PAGESIZE
        self.map_start = start // page * page
        self.length = end - self.map_start
        address = self.libc.mmap(
            None, self.length, mmap.PROT_READ, mmap.MAP_SHARED, fd, self.map_start
        )
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        self.base = int(address)
        self.pinned: list[tuple[int, int]] = []

    def address(self, offset: int) -> int:
        return self.base + (offset - self.map_start)

    def populate(self, start: int, end: int) -> bool:
        """Fault [start, end) into the mapping ahead of ``pin`` (``pages.populate``), so the
        driver's serial pinning finds the page tables filled; False where the kernel refuses."""
        page = mmap.PAGESIZE
        a = max(self.base, self.address(start // page * page))
        b = min(self.base + self.length, self.address(end))
        return pages.populate(a, b - a, write=False)

    def pin(self, start: int, end: int) -> None:
        """Pin [start, end) (file offsets; page-aligned by the caller except at the ends)."""
        page = mmap.PAGESIZE
        a = self.address(start // page * page) if start > self.map_start else self.base
        b = self.address(min(self.map_start + self.length, (end + page - 1) // page * page))
        err = _cudart().cudaHostRegister(
            a, b - a, _CUDA_HOST_REGISTER_READ_ONLY | _CUDA_HOST_REGISTER_PORTABLE
        )
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {err}")
        self.pinned.append((a, b - a))

    def close(self, pace: float = 0.0) -> None:
        """Unpin every slice, then unmap. ``pace``: seconds to pause between slices, so a
        background release never holds the driver for long against the caller's CUDA calls
        (unpinning a 512 MiB slice takes ≈ 4 ms and blocks, e.g., a ``torch.cuda.synchronize``
        issued meanwhile; unpinning 5 GB at once delayed one by 48 ms, bench/results/engine.md)."""
        for n, (a, _) in enumerate(self.pinned):
            if pace and n:
                time.sleep(pace)
            _cudart().cudaHostUnregister(a)
        self.pinned.clear()
        self.libc.munmap(self.base, self.length)


_releasing: list[threading.Thread] = []
RELEASE_PACE_S = 0.002


def _release_later(registered: _Registered, source: _FileSource | None) -> None:
    def release() -> None:
        registered.close(pace=RELEASE_PACE_S)
        if source is not None:
            source.close()

    thread = threading.Thread(target=release, name="engine-unpin", daemon=True)
    thread.start()
    _releasing.append(thread)


def wait_released() -> float:
    """Wait for pinned file pages of earlier loads to be released; returns the seconds waited."""
    t = time.perf_counter()
    while _releasing:
        _releasing.pop().join()
    return time.perf_counter() - t
