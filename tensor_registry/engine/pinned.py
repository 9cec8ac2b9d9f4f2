"""Pinned host memory for CUDA loads: the ring of pinned buffers, file pages pinned in place,
the CUDA runtime called through ctypes, and unpinning off the load's path.

Pinned memory from ``cudaHostAlloc`` (torch's ``pin_memory``) is slow to get: ≈ 0.45 s per GB,
the driver zeroing and pinning it on one thread, paid by the first load of every process. So the
ring is anonymous memory faulted in (zeroed) by several threads and pinned by
``cudaHostRegister`` a buffer at a time on a background thread, each buffer handed to the
readers as it is ready (registering costs about what registering cached file pages does, ≈ 25
ms per GB); torch's allocator is the fallback. A process keeps its ring between loads, the
registration calls go through ctypes (which releases the GIL while the driver works) and
registered file pages are unpinned on a background thread after the last byte is on the device
(``wait_released``).
"""

from __future__ import annotations

import ctypes
import mmap
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tensor_registry import os_memory
from tensor_registry.engine import prefault
from tensor_registry.engine.sources import FileSource

_CUDA_HOST_REGISTER_READ_ONLY = 8
_CUDA_HOST_REGISTER_PORTABLE = 1


def _host_view(address: int, length: int) -> Any:
    """A CPU uint8 tensor over raw memory (pinned or registered)."""
    import torch

    return torch.frombuffer((ctypes.c_char * length).from_address(address), dtype=torch.uint8)


def memview_at(address: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


class PinnedRing:
    """``count`` pinned host buffers of ``size`` bytes, each with its index (the row of the
    load's device staging buffer that pairs with it, when chunk digests run on the device);
    a reader gives a buffer back once the copies out of it are done.

    The buffers are faulted in and pinned one at a time on a background thread and handed out
    as each is ready, so a process's first load starts reading after one buffer (≈ 20 ms)
    instead of after the whole ring (≈ 0.3 s per GB; bench/RESULTS.md). ``complete`` is
    set when every buffer exists; ``how`` says how they were pinned: "register" (views of one
    anonymous mapping, each span registered), "torch" (torch's pinned allocator) or
    "register+torch" (the driver refused part way)."""

    def __init__(self, count: int, size: int, *, background: bool = True) -> None:
        self.count, self.size = count, size
        self.free: queue.SimpleQueue[tuple[Any, int]] = queue.SimpleQueue()
        self.how: str | None = None
        self.error: BaseException | None = None
        self.fill_s: float | None = None
        self.complete = threading.Event()
        # The caller's device, current on the filling thread too (the buffers are registered
        # portable, for every device, but a thread's first CUDA call opens a context).
        import torch

        self.device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        if background:
            threading.Thread(target=self._fill, name="engine-ring", daemon=True).start()
        else:
            self._fill()

    def _fill(self) -> None:
        started = time.perf_counter()
        try:
            if self.device is not None:
                import torch

                torch.cuda.set_device(self.device)
            made = 0
            base = _anonymous(self.count * self.size)
            if base is not None:
                with ThreadPoolExecutor(POPULATE_THREADS, thread_name_prefix="ring") as pool:
                    while made < self.count:
                        address = base + made * self.size
                        if not _populate_and_register(pool, address, self.size):
                            break
                        self.how = "register"
                        self.free.put((_host_view(address, self.size), made))
                        made += 1
                if made == 0:
                    os_memory.libc().munmap(base, self.count * self.size)  # type: ignore[union-attr]
            if made < self.count:
                import torch

                self.how = "register+torch" if made else "torch"
                for index in range(made, self.count):
                    host = torch.empty(self.size, dtype=torch.uint8, pin_memory=True)
                    self.free.put((host, index))
        except BaseException as exc:  # readers waiting on take() must not wait for ever
            self.error = exc
            for _ in range(self.count):
                self.free.put((None, -1))
        finally:
            self.fill_s = time.perf_counter() - started
            self.complete.set()

    def take(self) -> tuple[Any, int]:
        """A free buffer (waiting for one)."""
        return self._handed(self.free.get())

    def try_take(self) -> tuple[Any, int] | None:
        """A free buffer if one is there now, else None."""
        try:
            return self._handed(self.free.get_nowait())
        except queue.Empty:
            return None

    def _handed(self, entry: tuple[Any, int]) -> tuple[Any, int]:
        if entry[0] is None:
            self.free.put(entry)  # every other reader fails the same way
            raise RuntimeError("the pinned ring could not be allocated") from self.error
        return entry

    def give(self, buffer: Any, index: int) -> None:
        self.free.put((buffer, index))


POPULATE_THREADS = 8
# Transparent huge pages for the ring where the kernel grants them (MADV_HUGEPAGE): a fault
# per 2 MiB instead of per 4 KiB page (bench/RESULTS.md).
RING_HUGE_PAGES = True
_HUGE = 2 << 20


def _anonymous(length: int) -> int | None:
    """The address of ``length`` bytes of private anonymous memory (2 MiB aligned, advised into
    huge pages when :data:`RING_HUGE_PAGES`), not yet faulted in; None where the ring cannot be
    registered memory (no libc, only torch's binding of the runtime) and torch pins instead.
    The memory is kept for the life of the process, as the ring that views it is."""
    libc = os_memory.libc()
    cudart = cuda_runtime_library()
    if libc is None or length <= 0 or not hasattr(cudart, "engine_source"):
        return None
    address = libc.mmap(
        None,
        length + _HUGE,
        mmap.PROT_READ | mmap.PROT_WRITE,
        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
        -1,
        0,
    )
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    base = -(-int(address) // _HUGE) * _HUGE
    if RING_HUGE_PAGES:
        libc.madvise(base, length, os_memory.MADV_HUGEPAGE)  # advice: refused is fine
    return base


def _populate_and_register(pool: ThreadPoolExecutor, address: int, length: int) -> bool:
    """Fault [address, address + length) in on the pool's threads (``prefault.populate``: the
    kernel zeroes each page, which is most of what ``cudaHostAlloc`` spends on one thread), then
    pin it with ``cudaHostRegister``; False where the driver refuses."""
    page = mmap.PAGESIZE
    step = max(page, -(-length // POPULATE_THREADS // page) * page)
    pieces = [(a, min(step, address + length - a)) for a in range(address, address + length, step)]
    list(pool.map(lambda piece: prefault.populate(*piece, write=True), pieces))
    return (
        int(cuda_runtime_library().cudaHostRegister(address, length, _CUDA_HOST_REGISTER_PORTABLE))
        == 0
    )


def time_fresh_buffer(length: int) -> float | None:
    """Seconds to make one ring buffer of ``length`` bytes the ring's way (fresh memory faulted
    in on the populate threads, then registered), given back after; None where the ring
    cannot be registered memory here. The unaligned head of the mapping (under 2 MiB, never
    touched) stays mapped (tensor_registry.engine.plan's probe, once per process)."""
    base = _anonymous(length)
    if base is None:
        return None
    try:
        with ThreadPoolExecutor(POPULATE_THREADS, thread_name_prefix="ring-probe") as pool:
            started = time.perf_counter()
            ok = _populate_and_register(pool, base, length)
            seconds = time.perf_counter() - started
        if ok:
            cuda_runtime_library().cudaHostUnregister(base)
        return seconds if ok else None
    finally:
        os_memory.libc().munmap(base, length)  # type: ignore[union-attr]


# The pinned buffers each reader of a load keeps for itself (tensor_registry.engine.cuda): a
# block goes to the device while the next is read.
READER_BUFFERS = 2


def ring_count(readers: int, blocks: int) -> int:
    """Pinned ring buffers for a load: READER_BUFFERS per reader, but no more than the blocks
    the ring carries (rounded up to a multiple of four, so a process keeps few distinct rings).
    Fresh pinned memory is paid by the first load of every process: with cudaHostAlloc a vLLM
    rank loading a 1.3 GB file paid 0.6 s for a 2 GiB ring it could not fill
    (bench/RESULTS.md)."""
    want = max(READER_BUFFERS * readers, 8)
    if blocks <= 0:
        return 4
    return min(want, -(-blocks // 4) * 4)


def ring_ready(count: int, size: int) -> bool:
    """Whether this process already holds a whole ring of ``count`` buffers of ``size``."""
    ring = _rings.get((count, size))
    return ring is not None and ring.complete.is_set() and ring.error is None


_rings: dict[tuple[int, int], PinnedRing] = {}
_rings_lock = threading.Lock()


def shared_ring(count: int, size: int) -> PinnedRing:
    """The process's ring of ``count`` buffers of ``size`` bytes, made (filling in the
    background) by its first load that needs it.

    Pinning host memory is slow: a process keeps its ring between loads. Device staging is
    allocated per load instead, so a serving process (vLLM sizes its KV cache after the
    weights) does not keep 2 GiB of device memory for the next load."""
    with _rings_lock:
        ring = _rings.get((count, size))
        if ring is None:
            ring = _rings[(count, size)] = PinnedRing(count, size)
        return ring


_libcudart: Any = None


def cuda_runtime_library() -> Any:
    """The CUDA runtime torch loaded, called through ctypes: a ctypes call releases the GIL,
    so pinning (≈ 25 ms per GB, serialised in the driver) never stalls the reader threads,
    whose Python steps between preadv calls need the GIL (torch's own binding holds it)."""
    global _libcudart
    if _libcudart is not None:
        return _libcudart
    import torch

    from tensor_registry.engine.kernels import cuda_library

    torch.cuda.init()
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"]
    lib = cuda_library(names)
    if lib is not None:
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostRegister.restype = ctypes.c_int
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaHostUnregister.restype = ctypes.c_int
        lib.engine_source = lib._name  # type: ignore[attr-defined]
        _libcudart = lib
        return lib
    _libcudart = torch.cuda.cudart()  # no shared library found: torch's binding (holds the GIL)
    return _libcudart


class RegisteredFile:
    """A read-only shared mapping of [start, end) of a file, pinned in slices as it is used."""

    def __init__(self, fd: int, start: int, end: int) -> None:
        libc = os_memory.libc()
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
        """Fault [start, end) into the mapping ahead of ``pin`` (``prefault.populate``), so the
        driver's serial pinning finds the page tables filled; False where the kernel refuses."""
        page = mmap.PAGESIZE
        a = max(self.base, self.address(start // page * page))
        b = min(self.base + self.length, self.address(end))
        return prefault.populate(a, b - a, write=False)

    def pin(self, start: int, end: int) -> None:
        """Pin [start, end) (file offsets; page-aligned by the caller except at the ends)."""
        page = mmap.PAGESIZE
        a = self.address(start // page * page) if start > self.map_start else self.base
        b = self.address(min(self.map_start + self.length, (end + page - 1) // page * page))
        err = cuda_runtime_library().cudaHostRegister(
            a, b - a, _CUDA_HOST_REGISTER_READ_ONLY | _CUDA_HOST_REGISTER_PORTABLE
        )
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {err}")
        self.pinned.append((a, b - a))

    def close(self, pace: float = 0.0) -> None:
        """Unpin every slice, then unmap. ``pace``: seconds to pause between slices, so a
        background release never holds the driver for long against the caller's CUDA calls
        (unpinning a 512 MiB slice takes ≈ 4 ms and blocks, e.g., a ``torch.cuda.synchronize``
        issued meanwhile; unpinning 5 GB at once delayed one by 48 ms, bench/RESULTS.md)."""
        for n, (a, _) in enumerate(self.pinned):
            if pace and n:
                time.sleep(pace)
            cuda_runtime_library().cudaHostUnregister(a)
        self.pinned.clear()
        self.libc.munmap(self.base, self.length)


_releasing: list[threading.Thread] = []
RELEASE_PACE_S = 0.002


def release_later(registered: RegisteredFile, source: FileSource | None) -> None:
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
