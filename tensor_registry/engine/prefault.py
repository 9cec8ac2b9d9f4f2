"""Faulting a mapping's pages in ahead of their use: ``madvise(MADV_POPULATE_READ/WRITE)``
(Linux 5.14+) called through ctypes, which releases the GIL while the kernel works, so one call
per step replaces a page fault per 4 KiB page inside the thread that touches them next."""

from __future__ import annotations

import ctypes
import functools
import sys

MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library with ``mmap``, ``munmap`` and ``madvise`` typed; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):  # pragma: no cover - no usable libc
        return None
    return lib


def populate(address: int, length: int, *, write: bool) -> bool:
    """Fault ``length`` bytes at ``address`` (a page-aligned start) in: for writing (a private
    mapping's zeroed pages) or reading (a file's cached pages). False where the kernel refuses
    (older than 5.14) or there is no libc; an empty range asks nothing and is True."""
    if length <= 0:
        return True
    lib = libc()
    if lib is None:
        return False
    advice = MADV_POPULATE_WRITE if write else MADV_POPULATE_READ
    return bool(lib.madvise(address, length, advice) == 0)
