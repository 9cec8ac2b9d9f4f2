"""Faulting a mapping's pages in ahead of their use: ``madvise(MADV_POPULATE_READ/WRITE)``
(Linux 5.14+) called through ctypes, which releases the GIL while the kernel works, so one call
per step replaces a page fault per 4 KiB page inside the thread that touches them next."""

from __future__ import annotations

from tensor_registry.os_memory import MADV_POPULATE_READ, MADV_POPULATE_WRITE, libc


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
