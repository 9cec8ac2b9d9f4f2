"""Pinned host memory for CUDA loads: the ring of pinned buffers, file pages pinned in place,
the CUDA runtime called through ctypes, and unpinning off the load's path.

Pinning is slow (≈ 0.3 s per GB for fresh buffers; ≈ 25 ms per GB to register file pages, in
the driver), so a process keeps its ring between loads, the registration calls go through
ctypes (which releases the GIL while the driver works) and registered pages are unpinned on a
background thread after the last byte is on the device (``wait_released``).
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from app.client.engine.pinproc import Mapped, bind
from app.client.engine.sources import _FileSource


def _host_view(address: int, length: int) -> Any:
    """A CPU uint8 tensor over raw memory (pinned or registered)."""
    import torch

    return torch.frombuffer((ctypes.c_char * length).from_address(address), dtype=torch.uint8)


def _memview(address: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


TICKET_POLL_S = 0.00005


class _PinnedRing:
    """``count`` pinned host buffers of ``size`` bytes, each with its index (the row of the
    load's device staging buffer that pairs with it, when chunk digests run on the device);
    each handed back with what says its last copy is done, waited for before the buffer is
    refilled: the copy's CUDA event, or a ticket (an int).

    Tickets: after a buffer's copies the stream writes the ticket into ``flags[index]`` (pinned
    host memory, a D2H copy of 8 bytes, app.client.engine.cuda), so a reader waiting for the
    buffer polls memory and makes no CUDA call: while another thread of the process is inside
    ``cudaHostRegister`` every CUDA call waits, up to 180 ms (bench/results/engine.md, run 10).
    ``reserve`` hands each load its own range of ticket numbers."""

    def __init__(self, count: int, size: int, pin_memory: bool = True) -> None:
        import torch

        self.count = count
        self.free: queue.SimpleQueue[tuple[Any, int, Any]] = queue.SimpleQueue()
        for index in range(count):
            host = torch.empty(size, dtype=torch.uint8, pin_memory=pin_memory)
            self.free.put((host, index, None))
        self.flags = torch.zeros(count, dtype=torch.int64, pin_memory=pin_memory)
        self._flags = self.flags.numpy()
        self._issued = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> int:
        """The first of ``n`` ticket numbers no earlier load used (tickets start at 1)."""
        with self._lock:
            first = self._issued + 1
            self._issued += n
            return first

    def take(self) -> tuple[Any, int]:
        buffer, index, done = self.free.get()
        if isinstance(done, int):
            while int(self._flags[index]) != done:
                time.sleep(TICKET_POLL_S)
        elif done is not None:
            done.synchronize()
        return buffer, index

    def give(self, buffer: Any, index: int, done: Any) -> None:
        self.free.put((buffer, index, done))


_rings: dict[tuple[int, int], _PinnedRing] = {}
_rings_lock = threading.Lock()


def _ring(count: int, size: int) -> _PinnedRing:
    # Pinning host memory is slow (≈ 0.3 s per GB): a process keeps its ring between loads.
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
        bind(lib)
        lib.engine_source = name  # type: ignore[attr-defined]
        _libcudart = lib
        return lib
    _libcudart = torch.cuda.cudart()  # no shared library found: torch's binding (holds the GIL)
    return _libcudart


class _Registered(Mapped):
    """A read-only shared mapping of [start, end) of a file, pinned in slices by this process
    (app.client.engine.pinproc.Mapped with this process's CUDA runtime)."""

    def __init__(self, fd: int, start: int, end: int) -> None:
        super().__init__(fd, start, end, _cudart)


def cudart_path() -> str | None:
    """The file of the CUDA runtime this process loaded (for the pinning helper, which must
    load the same one), or None when it is not a shared library of its own."""
    _cudart()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if "libcudart" in os.path.basename(path) and os.path.isfile(path):
                    return path
    except OSError:
        return None
    return None


_releasing: list[threading.Thread] = []
RELEASE_PACE_S = 0.002


def _in_background(release: Callable[[], None]) -> None:
    """Run a load's clean-up after it returned (``wait_released`` waits for it)."""
    thread = threading.Thread(target=release, name="engine-unpin", daemon=True)
    thread.start()
    _releasing.append(thread)


def _release_later(registered: _Registered, source: _FileSource | None) -> None:
    def release() -> None:
        registered.close(pace=RELEASE_PACE_S)
        if source is not None:
            source.close()

    _in_background(release)


def wait_released() -> float:
    """Wait for pinned file pages of earlier loads to be released; returns the seconds waited."""
    t = time.perf_counter()
    while _releasing:
        _releasing.pop().join()
    return time.perf_counter() - t
