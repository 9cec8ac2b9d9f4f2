"""The C library's memory calls, one binding for every process that advises the kernel about
its mappings: ``mmap``, ``munmap`` and ``madvise`` typed through ctypes (which releases the GIL
while the kernel works), and the advice numbers the project uses.

Two sides call it: the load engine (faulting pages in ahead, ``engine/prefault.py``; the pinned
ring's own mapping, ``engine/pinned.py``) and the worker (handing file pages back,
``tensor_registry_server/artifacts/making/page_out.py``). No I/O framework, no torch: the light
install
imports it too.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

MADV_HUGEPAGE = 14  # transparent huge pages where the kernel grants them
MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now (file pages are read again on touch)
MADV_POPULATE_READ = 22  # Linux 5.14+: fault the pages in for reading
MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault the pages in for writing

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library with ``mmap``, ``munmap`` and ``madvise`` typed (``errno`` kept for
    ``ctypes.get_errno``); None off Linux or where there is no usable libc."""
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
        lib.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - no usable libc
        return None
    return lib
