"""File pages pinned in place, in this process or in a helper process of its own.

``Mapped`` is a read-only shared mapping of part of a file whose pages are pinned a slice at
a time (``cudaHostRegister``), so the DMA engine copies them with no CPU copy at all.

Why a helper process (bench/results/engine.md, run 10): while one thread of a process is
inside ``cudaHostRegister``, every other CUDA call of that process waits (issuing a copy
waited up to 180 ms, and a copy loop kept 8 deep fell from 55 to 10.6 GB/s), but pinning in
another process left the same copy loop at 54.5 GB/s. So the helper maps and pins the file's
tail and copies each slice into a device staging buffer of the loading process (CUDA IPC);
the loading process hashes and scatters from there while its own readers and copies never
wait for the driver. This file is the helper's program too (``python pinproc.py CUDART
DEVICE``): standard library only, so it starts fast and imports nothing of the registry.

Protocol, one JSON object per line; parent → helper: ``open`` (path, start, end, the staging
buffer's IPC handle), ``copy`` (start, end, offset into the staging buffer), ``release``;
helper → parent: ``ready``, ``opened``, ``done`` (start, once that slice is on the device),
``released`` (the staging handle is closed; the pages are unpinned after this), ``error``.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

READ_ONLY = 8
PORTABLE = 1
_MADV_POPULATE_READ = 22
_H2D = 1
_STREAM_NON_BLOCKING = 1
_EVENT_DISABLE_TIMING = 2
_IPC_LAZY_PEER_ACCESS = 1
START_TIMEOUT_S = 60.0


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def bind(lib: Any) -> Any:
    """Argument and result types of the CUDA runtime calls used here and in the engine (a
    pointer passed without them would be cut to 32 bits)."""
    vp, sz, u, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int
    signatures: dict[str, list[Any]] = {
        "cudaHostRegister": [vp, sz, u],
        "cudaHostUnregister": [vp],
        "cudaSetDevice": [i],
        "cudaFree": [vp],
        "cudaMalloc": [ctypes.POINTER(vp), sz],
        "cudaIpcGetMemHandle": [ctypes.POINTER(IpcHandle), vp],
        "cudaIpcOpenMemHandle": [ctypes.POINTER(vp), IpcHandle, u],
        "cudaIpcCloseMemHandle": [vp],
        "cudaStreamCreateWithFlags": [ctypes.POINTER(vp), u],
        "cudaMemcpyAsync": [vp, vp, sz, i, vp],
        "cudaEventCreateWithFlags": [ctypes.POINTER(vp), u],
        "cudaEventRecord": [vp, vp],
        "cudaEventSynchronize": [vp],
        "cudaEventDestroy": [vp],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    return lib


def check(lib: Any, err: int, what: str) -> None:
    if int(err) != 0:
        name = lib.cudaGetErrorString(int(err)) if hasattr(lib, "cudaGetErrorString") else b""
        raise RuntimeError(f"{what} failed: {int(err)} {(name or b'').decode()}")


class Mapped:
    """A read-only shared mapping of [start, end) of a file, pinned in slices as it is used;
    ``cudart`` gives the CUDA runtime (ctypes, so the GIL is released while the driver pins)."""

    def __init__(self, fd: int, start: int, end: int, cudart: Callable[[], Any]) -> None:
        self.cudart = cudart
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
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
        """Fault [start, end) into the mapping ahead of ``pin`` (``MADV_POPULATE_READ``, Linux
        5.14+), so the driver's serial pinning finds the page tables filled; False where the
        kernel refuses."""
        page = mmap.PAGESIZE
        a = max(self.base, self.address(start // page * page))
        b = min(self.base + self.length, self.address(end))
        return b <= a or self.libc.madvise(a, b - a, _MADV_POPULATE_READ) == 0

    def pin(self, start: int, end: int) -> None:
        """Pin [start, end) (file offsets; page-aligned by the caller except at the ends)."""
        page = mmap.PAGESIZE
        a = self.address(start // page * page) if start > self.map_start else self.base
        b = self.address(min(self.map_start + self.length, (end + page - 1) // page * page))
        err = self.cudart().cudaHostRegister(a, b - a, READ_ONLY | PORTABLE)
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
            self.cudart().cudaHostUnregister(a)
        self.pinned.clear()
        self.libc.munmap(self.base, self.length)


# --------------------------------------------------------------------------------------------
# The parent's side


class PinHelper:
    """One helper process for one device, kept for the life of this process (its start, a
    CUDA context of its own, costs ≈ 0.3 s once). One load at a time uses it (``lock``)."""

    def __init__(self, cudart_path: str, device_index: int) -> None:
        self.device_index = device_index
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), cudart_path, str(device_index)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONNOUSERSITE": "1"},
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out: IO[bytes] = self.proc.stdout
        self.started = threading.Event()
        self.start_error: str | None = None
        threading.Thread(target=self._await_ready, daemon=True, name="pin-helper-start").start()

    def _await_ready(self) -> None:
        try:
            reply = self.recv()
            if not reply.get("ready"):
                self.start_error = str(reply.get("error", reply))
        except Exception as exc:  # the helper died at start
            self.start_error = f"{type(exc).__name__}: {exc}"
        self.started.set()

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> bool:
        return self.started.wait(timeout) and self.start_error is None and self.alive()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, **message: Any) -> None:
        self._in.write(json.dumps(message).encode() + b"\n")
        self._in.flush()

    def recv(self) -> dict[str, Any]:
        line = self._out.readline()
        if not line:
            raise RuntimeError(f"the pinning helper exited (status {self.proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        if self.alive():
            try:
                self._in.close()
                self.proc.wait(timeout=5)
            except Exception:
                self.proc.kill()


class DeviceStaging:
    """``nbytes`` of device memory of its own (``cudaMalloc``, not torch's cache: its IPC handle
    must cover exactly this buffer) that the helper copies into; ``tensor`` is a torch view of
    it. Freed by ``free`` once the helper has closed its handle."""

    def __init__(self, cudart: Any, nbytes: int, device: Any) -> None:
        import torch

        self.cudart, self.nbytes = cudart, nbytes
        pointer = ctypes.c_void_p()
        check(cudart, cudart.cudaMalloc(ctypes.byref(pointer), nbytes), "cudaMalloc")
        self.pointer = int(pointer.value or 0)
        try:
            handle = IpcHandle()
            check(
                cudart, cudart.cudaIpcGetMemHandle(ctypes.byref(handle), self.pointer), "IPC handle"
            )
            self.handle_hex = ctypes.string_at(ctypes.addressof(handle), 64).hex()
            self.__cuda_array_interface__ = {
                "shape": (nbytes,),
                "typestr": "|u1",
                "data": (self.pointer, False),
                "version": 3,
            }
            self.tensor = torch.as_tensor(self, device=device)
        except BaseException:
            cudart.cudaFree(self.pointer)
            raise

    def free(self) -> None:
        del self.tensor
        self.cudart.cudaFree(self.pointer)


_helpers: dict[tuple[int, int], PinHelper] = {}
_helpers_lock = threading.Lock()


def helper(cudart_path: str, device_index: int, number: int = 0) -> PinHelper:
    """This process's helper ``number`` for ``device_index``, started on first use (a dead one
    is replaced)."""
    with _helpers_lock:
        found = _helpers.get((device_index, number))
        if found is None or not found.alive():
            found = _helpers[(device_index, number)] = PinHelper(cudart_path, device_index)
        return found


def shutdown() -> None:
    with _helpers_lock:
        for h in _helpers.values():
            h.close()
        _helpers.clear()


# --------------------------------------------------------------------------------------------
# The helper's side


def _serve(cudart_path: str, device_index: int) -> int:
    out_lock = threading.Lock()

    def reply(**message: Any) -> None:
        with out_lock:
            sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
            sys.stdout.buffer.flush()

    try:
        lib = bind(ctypes.CDLL(cudart_path))
        check(lib, lib.cudaSetDevice(device_index), "cudaSetDevice")
        check(lib, lib.cudaFree(None), "context start")
        stream = ctypes.c_void_p()
        made = lib.cudaStreamCreateWithFlags(ctypes.byref(stream), _STREAM_NON_BLOCKING)
        check(lib, made, "stream")
    except Exception as exc:
        reply(error=f"{type(exc).__name__}: {exc}")
        return 1
    reply(ready=True)
    copies: queue.SimpleQueue[tuple[int, ctypes.c_void_p] | None] = queue.SimpleQueue()

    def notify() -> None:
        # Waits for each copy in order and says so; a separate thread, so the next slice is
        # pinned while this one is on its way.
        lib.cudaSetDevice(device_index)
        while (item := copies.get()) is not None:
            start, event = item
            err = lib.cudaEventSynchronize(event)
            lib.cudaEventDestroy(event)
            if int(err):
                reply(error=f"copy of {start}: CUDA error {int(err)}", start=start)
            else:
                reply(done=start)

    notifier: threading.Thread | None = None
    mapping: Mapped | None = None
    staging = ctypes.c_void_p()
    fd = -1
    for line in sys.stdin.buffer:
        message = json.loads(line)
        op = message.get("op")
        try:
            if op == "open":
                fd = os.open(message["path"], os.O_RDONLY)
                mapping = Mapped(fd, message["start"], message["end"], lambda: lib)
                handle = IpcHandle()
                ctypes.memmove(ctypes.addressof(handle), bytes.fromhex(message["handle"]), 64)
                check(
                    lib,
                    lib.cudaIpcOpenMemHandle(ctypes.byref(staging), handle, _IPC_LAZY_PEER_ACCESS),
                    "cudaIpcOpenMemHandle",
                )
                notifier = threading.Thread(target=notify, daemon=True)
                notifier.start()
                reply(opened=True)
            elif op == "copy":
                assert mapping is not None and staging.value is not None
                start, end = message["start"], message["end"]
                mapping.pin(start, end)
                event = ctypes.c_void_p()
                check(
                    lib,
                    lib.cudaEventCreateWithFlags(ctypes.byref(event), _EVENT_DISABLE_TIMING),
                    "event",
                )
                check(
                    lib,
                    lib.cudaMemcpyAsync(
                        staging.value + message["offset"],
                        mapping.address(start),
                        end - start,
                        _H2D,
                        stream,
                    ),
                    "cudaMemcpyAsync",
                )
                check(lib, lib.cudaEventRecord(event, stream), "cudaEventRecord")
                copies.put((start, event))
            elif op == "release":
                if notifier is not None:
                    copies.put(None)
                    notifier.join()
                    notifier = None
                if staging.value is not None:
                    lib.cudaIpcCloseMemHandle(staging)
                    staging = ctypes.c_void_p()
                reply(released=True)
                # Unpinning happens here, in this process: the loading process never waits.
                if mapping is not None:
                    mapping.close()
                    mapping = None
                if fd >= 0:
                    os.close(fd)
                    fd = -1
        except Exception as exc:
            reply(error=f"{op}: {type(exc).__name__}: {exc}", start=message.get("start"))
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1], int(sys.argv[2])))
