"""Hand memory-mapped file pages back to the kernel: `madvise(MADV_PAGEOUT)`.

MADV_PAGEOUT (Linux >= 5.4) reclaims the given pages now. Clean file-backed pages are dropped
and read again from the file on the next touch; the contents a process sees never change. It is
how the worker keeps memory-mapped safetensors from piling up in its RSS (`serialize._PageReleaser`
while writing, `SourcePager` while casting on load). Only ranges inside mappings of regular files
are ever advised; anonymous memory is left alone. Where the call is refused (an old kernel, a
sandbox), `Pager.pageout` turns itself off and memory behaves as without it.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from tensor_registry.os_memory import MADV_PAGEOUT, PAGE, libc

log = logging.getLogger(__name__)


def file_backed_ranges(paths: Iterable[Path] | None = None) -> list[tuple[int, int]]:
    """Address ranges of this process mapped from regular files (all, or only `paths`)."""
    wanted = {str(Path(p).resolve()) for p in paths} if paths is not None else None
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or fields[4] == "0":
                    continue  # anonymous memory (heap, torch's allocations)
                path = fields[5].strip()
                if not path.startswith("/") or path.startswith(("/dev/", "/memfd:", "/SYSV")):
                    continue
                if wanted is not None and path not in wanted:
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    except OSError:
        return []
    return sorted(ranges)


class Pager:
    """`pageout(start, size)` limited to the file-backed `ranges` given."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges = ranges
        self.released_bytes = 0
        self._lock = threading.Lock()
        # Off (None) where there is nothing to advise or no libc, and once the kernel refuses.
        self._libc = libc() if ranges else None

    @property
    def active(self) -> bool:
        return self._libc is not None

    def pageout(self, address: int, size: int) -> None:
        lib = self._libc
        if lib is None:
            return
        start = -(-address // PAGE) * PAGE
        end = (address + size) // PAGE * PAGE
        for lo, hi in self.ranges:
            a, b = max(start, lo), min(end, hi)
            if a >= b:
                continue
            if lib.madvise(a, b - a, MADV_PAGEOUT) != 0:
                log.debug("madvise(MADV_PAGEOUT) failed: errno %d", ctypes.get_errno())
                self._libc = None
                return
            with self._lock:
                self.released_bytes += b - a


class SourcePager:
    """While a model is built from memory-mapped safetensors in *another* dtype, page the
    source mappings out every `interval` seconds from a background thread.

    transformers casts each tensor out of the file mapping into fresh memory; the source pages
    it has read stay mapped (and counted in RSS) until loading ends, so a float32 checkpoint
    loaded as bfloat16 peaked at imports + the float32 file + the bfloat16 model. With the
    pager the file side stays near what is being cast at the moment. A page paged out just
    before it is read is simply read again. Not for same-dtype loads, whose parameters *are*
    the mapped pages.
    """

    def __init__(self, files: Iterable[Path], interval: float = 0.01) -> None:
        self._files = [Path(f) for f in files]
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.released_bytes = 0

    def __enter__(self) -> SourcePager:
        if sys.platform == "linux" and self._files:
            self._thread = threading.Thread(target=self._run, name="source-pager", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            pager = Pager(file_backed_ranges(self._files))
            for lo, hi in pager.ranges:
                pager.pageout(lo, hi - lo)
            if pager.ranges and not pager.active:
                return  # refused here: stop trying
            self.released_bytes += pager.released_bytes
