"""Where a local load's two paths meet: the ring's readers take blocks from the front of a
file, the pinning threads slices from the back (tensor_registry.engine.cuda)."""

from __future__ import annotations

import threading

from tensor_registry.engine.sources import URL_RANGE_MAX


class Frontier:
    """The file's blocks, shared by the two paths of a local load: the ring's readers take
    blocks from the front, the pinning threads a slice at a time from the back. ``floor`` is the
    lowest offset the pinning may take (``register_fraction``): without ``balance`` the readers
    stop there and the split is fixed (load_cuda's default); with it both go on until they meet.

    ``spread`` (the readers of a URL): a claim takes several blocks, read with one range
    request, as many as half a reader's share of what is left (at most URL_RANGE_MAX), so the
    first claims are long and the last ones a block each and the readers end together. Each
    request costs the server a signature check and the connection a round trip with nothing on
    the wire: from a real ``serve``, 12 connections, a request per 64 MiB block carried 24.1
    GB/s where spans carried 28.3 (bench/RESULTS.md). 0: a block a claim (local
    files, where a claim costs nothing)."""

    def __init__(
        self, size: int, block: int, floor: int, balance: bool = False, spread: int = 0
    ) -> None:
        self.size, self.block, self.floor, self.balance = size, block, floor, balance
        self.spread = spread
        self.lo, self.hi = 0, size
        self.lock = threading.Lock()

    def front(self) -> tuple[int, int] | None:
        """The next span for a reader: (start, end), or None when none is left. Its blocks are
        [start + i * block, …) up to end."""
        with self.lock:
            limit = self.hi if self.balance else min(self.hi, self.floor)
            if self.lo >= limit:
                return None
            blocks = 1
            if self.spread:
                left = -(-(limit - self.lo) // self.block)
                most = max(1, URL_RANGE_MAX // self.block)
                blocks = max(1, min(most, -(-left // (2 * self.spread))))
            start, end = self.lo, min(limit, self.lo + blocks * self.block)
            self.lo = end
            return start, end

    def back(self, slice_bytes: int) -> tuple[int, int] | None:
        """The next slice for the pinning thread (start on a block boundary), or None. Near the
        meeting point it takes half of what is left, so neither path waits long on the other."""
        with self.lock:
            low = max(self.lo, self.floor)
            gap = self.hi - low
            if gap <= 0:
                return None
            take = slice_bytes if not self.balance else min(slice_bytes, max(self.block, gap // 2))
            # The first block boundary at or above hi - take: a slice never exceeds slice_bytes.
            start = max(low, -(-(self.hi - take) // self.block) * self.block)
            end, self.hi = self.hi, start
            return start, end

    @property
    def registered(self) -> int:
        return self.size - self.hi
