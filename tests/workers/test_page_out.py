"""`tensor_registry_server.artifacts.making.page_out`: file pages handed back with MADV_PAGEOUT
leave RSS and
keep their
contents."""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tensor_registry_server.artifacts.making.page_out import Pager, SourcePager, file_backed_ranges
from tests.kernel import pageout_supported

SIZE = 64 << 20


def rss_file_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile")


@pytest.fixture
def mapped(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(SIZE))
    with path.open("rb") as f:
        m = mmap.mmap(f.fileno(), SIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    # The mapping is unmapped when the last view of it goes (pytest keeps the fixture value
    # until teardown ends, so it cannot be closed here).
    yield path, np.frombuffer(m, dtype=np.uint8)


def touch(view: np.ndarray) -> str:
    return hashlib.sha256(view.tobytes()).hexdigest()


def test_pageout_drops_file_pages_and_keeps_contents(mapped) -> None:  # type: ignore[no-untyped-def]
    path, view = mapped
    digest = touch(view)
    before = rss_file_kib()
    pager = Pager(file_backed_ranges([path]))
    assert pager.ranges
    pager.pageout(int(view.ctypes.data), SIZE)
    dropped_mib = (before - rss_file_kib()) / 1024
    if pageout_supported():
        assert pager.active
        assert dropped_mib > 0.8 * SIZE / 2**20, dropped_mib
        assert pager.released_bytes >= 0.8 * SIZE
    else:  # refused by this kernel: the pager turns itself off, nothing else changes
        assert not pager.active and pager.released_bytes == 0
    assert touch(view) == digest  # read again from the file, same bytes


def test_only_ranges_of_the_named_files_and_never_anonymous_memory(mapped) -> None:  # type: ignore[no-untyped-def]
    path, _view = mapped
    anonymous = np.ones(SIZE, dtype=np.uint8)
    pager = Pager(file_backed_ranges([path]))
    pager.pageout(int(anonymous.ctypes.data), SIZE)  # outside every range: nothing happens
    assert pager.released_bytes == 0
    assert int(anonymous.sum()) == SIZE
    assert Pager(file_backed_ranges([path.with_name("other.bin")])).ranges == []


def test_source_pager_keeps_the_source_out_of_rss_while_it_runs(mapped) -> None:  # type: ignore[no-untyped-def]
    path, view = mapped
    base = rss_file_kib()
    digest = touch(view)
    assert (rss_file_kib() - base) / 1024 > 0.8 * SIZE / 2**20  # all of it resident now
    with SourcePager([path], interval=0.01) as pager:
        deadline = time.monotonic() + (5 if pageout_supported() else 0.2)
        while pager.released_bytes < 0.8 * SIZE and time.monotonic() < deadline:
            time.sleep(0.02)
        grown_mib = (rss_file_kib() - base) / 1024
    if pageout_supported():
        assert pager.released_bytes >= 0.8 * SIZE
        assert grown_mib < 0.2 * SIZE / 2**20, grown_mib
    else:
        assert pager.released_bytes == 0
    assert touch(view) == digest
