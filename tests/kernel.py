"""What the kernel under the tests supports, probed directly (not through the code under test)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import sys
import tempfile

import numpy as np


@functools.cache
def pageout_supported() -> bool:
    """Does madvise(MADV_PAGEOUT) (Linux >= 5.4) work here? The memory tests assert pages are
    given back where it does, and that nothing else changes where it does not."""
    if sys.platform != "linux":
        return False
    with tempfile.TemporaryFile() as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        m = mmap.mmap(f.fileno(), 1 << 20, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        view = np.frombuffer(m, dtype=np.uint8)
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        ok = bool(view[0] >= 0) and madvise(int(view.ctypes.data), 1 << 20, 21) == 0
        del view
        with contextlib.suppress(BufferError):
            m.close()
        return ok
