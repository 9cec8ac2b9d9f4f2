"""Async copies, events and stream waits through the CUDA runtime, called with ctypes.

A load's threads issue a copy per tensor segment of every block. torch's ``copy_`` and an
event's ``record`` each hold the GIL while they run: sixteen readers issuing them for 8 MiB
blocks spent 2-6.6 thread-seconds issuing against 2.7-3.5 reading (bench/RESULTS.md). A ctypes call
releases the GIL for the call, and these calls take raw addresses: the pinned ring's buffers, a
registered slice of a mapped file, the device allocation.

``runtime()`` is the process's ``CudaRuntime`` over the shared library tensor_registry.engine.pinned
found; None where only torch's binding of the runtime exists (it lacks these calls).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from tensor_registry.engine.kernels import CudaError
from tensor_registry.engine.pinned import cuda_runtime_library

# cudaMemcpyDefault: the direction follows from the addresses (unified addressing, which every
# 64-bit CUDA process has), so one call serves host → device and device → device.
_MEMCPY_DEFAULT = 4
_EVENT_DISABLE_TIMING = 2


class CudaRuntime:
    def __init__(self, lib: Any) -> None:
        lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        lib.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaEventDestroy.argtypes = [ctypes.c_void_p]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        for name in (
            "cudaMemcpyAsync",
            "cudaEventCreateWithFlags",
            "cudaEventRecord",
            "cudaEventSynchronize",
            "cudaEventDestroy",
            "cudaStreamSynchronize",
        ):
            getattr(lib, name).restype = ctypes.c_int
        self.lib = lib

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise CudaError(f"{what}: CUDA runtime error {status}")

    def copy(self, dst: int, src: int, length: int, stream: int) -> None:
        """Copy ``length`` bytes from address ``src`` to ``dst`` on ``stream`` (a handle)."""
        self._check(
            self.lib.cudaMemcpyAsync(dst, src, length, _MEMCPY_DEFAULT, stream), "cudaMemcpyAsync"
        )

    def event(self) -> int:
        handle = ctypes.c_void_p()
        self._check(
            self.lib.cudaEventCreateWithFlags(ctypes.byref(handle), _EVENT_DISABLE_TIMING),
            "cudaEventCreateWithFlags",
        )
        return int(handle.value or 0)

    def record(self, event: int, stream: int) -> None:
        self._check(self.lib.cudaEventRecord(event, stream), "cudaEventRecord")

    def wait(self, event: int) -> None:
        """Until the work recorded in ``event`` has finished (the GIL free meanwhile)."""
        self._check(self.lib.cudaEventSynchronize(event), "cudaEventSynchronize")

    def destroy(self, event: int) -> None:
        self._check(self.lib.cudaEventDestroy(event), "cudaEventDestroy")

    def sync(self, stream: int) -> None:
        self._check(self.lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")


_runtime: CudaRuntime | None = None
_lock = threading.Lock()


def runtime() -> CudaRuntime | None:
    global _runtime
    with _lock:
        if _runtime is None:
            lib = cuda_runtime_library()
            if not hasattr(lib, "engine_source"):
                return None
            _runtime = CudaRuntime(lib)
        return _runtime
