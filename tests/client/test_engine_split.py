"""How a local CUDA load shares a file between its two paths
(tensor_registry.engine.frontier.Frontier):
readers from the front a block at a time, the pinning thread from the back a slice at a time.
The claims must cover every byte exactly once, on block boundaries, with no slice larger than
the pinning thread's staging buffer and none below the ``register_fraction`` floor. Pure
Python: runs without a GPU."""

from __future__ import annotations

import itertools
import random
import threading
from pathlib import Path

import pytest

from tensor_registry.engine.frontier import Frontier

MiB = 1 << 20


def _drain(frontier: Frontier, slice_bytes: int, pattern: list[str]) -> tuple[list, list]:
    """Claims in the order ``pattern`` gives ("f" a reader, "b" the pinning thread), then the
    rest alternately until both sides are out."""
    front: list[tuple[int, int]] = []
    back: list[tuple[int, int]] = []
    steps = iter(pattern)
    done = {"f": False, "b": False}
    while not (done["f"] and done["b"]):
        side = next(steps, None) or ("f" if len(front) <= len(back) and not done["f"] else "b")
        if done[side]:
            side = "b" if side == "f" else "f"
        if side == "f":
            claim = frontier.front()
            if claim is None:
                done["f"] = True
            else:
                front.append(claim)
        else:
            got = frontier.back(slice_bytes)
            if got is None:
                done["b"] = True
            else:
                back.append(got)
    return front, back


def _assert_partition(size: int, pieces: list[tuple[int, int]]) -> None:
    pieces = sorted(pieces)
    assert pieces[0][0] == 0 and pieces[-1][1] == size
    for (_, end), (start, _) in itertools.pairwise(pieces):
        assert end == start, f"gap or overlap at {end} / {start}"


@pytest.mark.parametrize("seed", range(20))
def test_balanced_claims_cover_the_file_once(seed: int) -> None:
    rng = random.Random(seed)
    block = 64 * MiB
    size = rng.randrange(1, 40) * block + rng.randrange(0, block)
    slice_bytes = rng.choice([1, 2, 4, 8]) * block
    fraction = rng.choice([0.3, 0.7, 1.0])
    floor = int(size * (1 - fraction)) // block * block
    frontier = Frontier(size, block, floor, balance=True)
    pattern = [rng.choice("fffb") for _ in range(rng.randrange(0, 60))]
    front, back = _drain(frontier, slice_bytes, pattern)
    _assert_partition(size, front + back)
    for start, end in front:
        assert start % block == 0 and end - start <= block
    for start, end in back:
        assert start % block == 0 and start >= floor
        assert end - start <= slice_bytes, (start, end, slice_bytes)
    assert frontier.registered == sum(end - start for start, end in back)


def test_fixed_split_stops_the_readers_at_the_floor() -> None:
    block = 64 * MiB
    size = 10 * block + 12345
    floor = int(size * 0.3) // block * block
    frontier = Frontier(size, block, floor, balance=False)
    front, back = _drain(frontier, 4 * block, ["f"] * 100)
    assert front and max(end for _, end in front) == floor
    assert min(start for start, _ in back) == floor
    assert frontier.registered == size - floor
    _assert_partition(size, front + back)


def test_no_floor_means_the_readers_take_everything() -> None:
    block = 64 * MiB
    size = 5 * block
    frontier = Frontier(size, block, size, balance=True)
    front, back = _drain(frontier, 2 * block, [])
    assert back == [] and frontier.registered == 0
    _assert_partition(size, front)


def test_a_slower_pinning_thread_gets_less_of_the_file() -> None:
    """The point of meeting in the middle: whichever side claims faster carries more."""
    block = 64 * MiB
    size = 64 * block
    frontier = Frontier(size, block, 0, balance=True)
    # Four reader claims for every pinning claim of up to 4 blocks: readers carry most.
    front, back = _drain(frontier, 4 * block, ["f", "f", "f", "f", "f", "f", "f", "f", "b"] * 20)
    assert sum(e - s for s, e in front) > sum(e - s for s, e in back) > 0
    _assert_partition(size, front + back)


def test_claims_from_many_threads_at_once() -> None:
    block = 8 * MiB
    size = 300 * block + 5
    frontier = Frontier(size, block, 0, balance=True)
    claims: list[tuple[int, int]] = []
    lock = threading.Lock()

    def reader() -> None:
        while (claim := frontier.front()) is not None:
            with lock:
                claims.append(claim)

    def pinner() -> None:
        while (claim := frontier.back(16 * block)) is not None:
            with lock:
                claims.append(claim)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    threads.append(threading.Thread(target=pinner))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_partition(size, claims)


def test_prefaulting_a_file_mapping_reads_the_pages_in(tmp_path: Path) -> None:
    """The pinning thread's helper (``RegisteredFile.populate``, MADV_POPULATE_READ) faults the
    mapping in without pinning anything, and leaves the bytes as they are in the file."""
    import ctypes
    import os

    from tensor_registry.engine.pinned import RegisteredFile

    data = os.urandom(3 << 20) + b"tail"
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        mapping = RegisteredFile(fd, 1 << 20, len(data))
        assert mapping.populate(1 << 20, len(data)) is True
        assert mapping.populate(5, 5) is True  # an empty range asks nothing of the kernel
        got = ctypes.string_at(mapping.address(1 << 20), len(data) - (1 << 20))
        assert got == data[1 << 20 :]
        assert mapping.pinned == []
        mapping.close()
    finally:
        os.close(fd)


def test_a_small_load_pins_only_the_ring_it_can_fill() -> None:
    """Fresh pinned memory is the first load's biggest fixed cost (≈ 0.3 s per GB): the ring
    never exceeds the blocks it will carry (a multiple of four, so a process keeps few rings)."""
    from tensor_registry.engine.pinned import ring_count

    assert ring_count(16, 1000) == 32  # a big file: two buffers per reader
    assert ring_count(16, 21) == 24 and ring_count(16, 16) == 16
    assert ring_count(16, 10) == 12 and ring_count(16, 3) == 4 and ring_count(16, 0) == 4
    assert ring_count(4, 1000) == 8  # never below the old floor of eight for big files


@pytest.mark.parametrize("readers", [1, 3, 12])
def test_url_readers_claim_long_spans_first_and_single_blocks_last(readers: int) -> None:
    """Over a URL a claim is one range request: half a reader's share of what is left, so a
    10 GB file takes a few dozen requests instead of one per block, and the last claims are a
    block each so the readers end together. Never more than URL_RANGE_MAX in one."""
    from tensor_registry.engine.sources import URL_RANGE_MAX

    block = 64 * MiB
    size = 148 * block + 12345
    frontier = Frontier(size, block, size, spread=readers)
    claims = []
    while (claim := frontier.front()) is not None:
        claims.append(claim)
    _assert_partition(size, claims)
    lengths = [end - start for start, end in claims]
    assert all(a >= b for a, b in itertools.pairwise(lengths[:-1]))  # long first
    assert max(lengths) <= URL_RANGE_MAX and lengths[-2] == block
    assert len(claims) < 149 / 2  # far fewer requests than blocks
    assert all(start % block == 0 for start, _ in claims)
    local = Frontier(size, block, size)  # a local file: a block a claim
    assert sum(1 for _ in iter(local.front, None)) == 149
