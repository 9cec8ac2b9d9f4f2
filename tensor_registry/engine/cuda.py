"""Loads onto a CUDA device: one allocation per file, every chunk verified on the way.

Each tensor gets a 256-byte aligned slot in the allocation (tensor_registry.engine.views) and every
block of file bytes is scattered to its tensors' slots by async copies. Blocks reach the device
two ways at once (local files): reader threads ``preadv`` blocks into pinned buffers of their
own, two each from the process's ring, and copy each block as soon as it is read, on that
buffer's stream (a CPU copy out of the page cache; 8 MiB blocks when nothing is pinned), while
one thread maps the tail of the file, pins its pages in place with ``cudaHostRegister``
(read-only) a slice at a time and copies them with no CPU copy at all (the driver's pinning and
the DMA engine; tensor_registry.engine.pinned). ``register_fraction`` splits the file between the
two (bench/results/engine.md). Over a URL only the pinned ring runs, fed by HTTP range
connections. Copies, events and waits go through the CUDA runtime with ctypes
(tensor_registry.engine.copies), with addresses: no torch call per block.

Verification: on the device, each block goes host → a device staging buffer, is hashed there
(tensor_registry.engine.gpu_blake3, CUDA C built by NVRTC) and scattered from it; the digests are
compared on the device after the last copy. Otherwise (``digest_on="host"``, or no NVRTC) each
chunk is hashed on the thread that brought it, overlapped with its copy. torch is imported
inside the functions.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_registry.engine.checks import (
    ChunkMismatch,
    checked_reads,
    mismatch_error,
    raise_short,
    short_read_error,
    verify_block,
)
from tensor_registry.engine.copies import runtime
from tensor_registry.engine.pinned import (
    RegisteredFile,
    memview_at,
    release_later,
    shared_ring,
)
from tensor_registry.engine.sources import (
    BLOCK_BYTES,
    URL_RANGE_MAX,
    FileSource,
    HTTPRangeReader,
    block_ranges,
    block_size_for,
)
from tensor_registry.engine.views import device_views, slot_plan, slot_segments
from tensor_registry.formats.layout import FileLayout

REGISTER_SLICE = 512 << 20
# A local file's ring blocks (one 8 MiB chunk of the manifest's digests) and the pinned buffers
# each reader keeps for itself: a block goes to the device while the next is read, each
# reader cycling through 16 MiB. Page cache -> device through two 8 MiB buffers per thread
# carried 41-50 GB/s where 64 MiB ones carried 31-36 (bench/cache_dma.py, runs 32-36), and the
# engine's ring-only load went from 33.6 to 39.9 GB/s verified, same host (run 38). A URL's
# blocks stay BLOCK_BYTES: over loopback TCP 8 MiB pieces carried no more (30.1 and 30.1, run
# 32).
FILE_BLOCK_BYTES = 8 << 20
READER_BUFFERS = 2


@dataclass
class _Slot:
    """A pinned ring buffer a reader holds for one load: its address and a view of it, the
    address of its device staging row (on-device digests), its own stream and the event of its
    last copies."""

    buffer: Any
    index: int
    address: int
    view: memoryview
    staged: int | None
    stream: int
    event: int
    recorded: bool = False


class _Frontier:
    """The file's blocks, shared by the two paths of a local load: the ring's readers take
    blocks from the front, the pinning threads a slice at a time from the back. ``floor`` is the
    lowest offset the pinning may take (``register_fraction``): without ``balance`` the readers
    stop there and the split is fixed (load_cuda's default); with it both go on until they meet.

    ``spread`` (the readers of a URL): a claim takes several blocks, read with one range
    request, as many as half a reader's share of what is left (at most URL_RANGE_MAX), so the
    first claims are long and the last ones a block each and the readers end together. Each
    request costs the server a signature check and the connection a round trip with nothing on
    the wire: from a real ``serve``, 12 connections, a request per 64 MiB block carried 24.1
    GB/s where spans carried 28.3 (bench/results/engine.md, run 28). 0: a block a claim (local
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


_warm: set[tuple[str, int]] = set()  # (device, chunk_bytes) whose kernels ran here
_warm_lock = threading.Lock()
# "auto" digests go to the device once its kernels ran in this process, or for a file this big:
# loading the cached cubin and the staging cost a fresh process ≈ 0.05-0.09 s, which host digests
# of a small file do not (1.35 GB node-cache first load: 0.17 s on the device, 0.13 s on the
# host), while from a few GB on the device wins (9.93 GB: 0.38 s against 0.66 s; bench/results/
# engine.md, run 20).
DEVICE_DIGESTS_FROM = 2 * 10**9


def _ring_count(readers: int, blocks: int) -> int:
    """Pinned ring buffers for a load: READER_BUFFERS per reader, but no more than the blocks
    the ring carries (rounded up to a multiple of four, so a process keeps few distinct rings).
    Fresh pinned memory is paid by the first load of every process: with cudaHostAlloc a vLLM
    rank loading a 1.3 GB file paid 0.6 s for a 2 GiB ring it could not fill
    (bench/results/engine.md)."""
    want = max(READER_BUFFERS * readers, 8)
    if blocks <= 0:
        return 4
    return min(want, -(-blocks // 4) * 4)


def _device_digests(file: FileLayout, device: Any, digest_on: str) -> Any:
    """The on-device BLAKE3 of ``file``'s chunks (tensor_registry.engine.gpu_blake3), or None when
    the host hashes them: ``digest_on`` "host", a chunk size the kernels cannot hash, or ("auto") a
    small file in a process whose kernels have not run yet, or kernels that cannot be built
    here (no NVRTC, no driver). NVRTC builds them once per machine (0.1-0.8 s; the cubin is
    cached on disk); loading the cached cubin takes a fresh process ≈ 0.05 s."""
    if digest_on == "host":
        return None
    from tensor_registry.engine import gpu_blake3

    if not gpu_blake3.supported(file.chunk_bytes):
        if digest_on == "device":
            raise ValueError(f"chunk_bytes {file.chunk_bytes} cannot be hashed on the device")
        return None
    key = (str(device), file.chunk_bytes)
    if digest_on == "auto" and key not in _warm and file.size < DEVICE_DIGESTS_FROM:
        return None  # starting the kernels would cost this first load more than host digests
    try:
        with _warm_lock:
            if key not in _warm:
                gpu_blake3.warm_up(device, file.chunk_bytes)
                _warm.add(key)
        return gpu_blake3.DeviceDigests(file, device)
    except Exception:
        # No NVRTC or driver library, or a device it cannot build for: the host threads
        # hash instead; "device" asked for it explicitly and fails.
        if digest_on == "device":
            raise
        return None


def load_cuda(
    file: FileLayout,
    *,
    path: Path | str | None = None,
    url: str | None = None,
    device: Any = "cuda",
    verify: bool = True,
    readers: int = 16,
    block_bytes: int | None = None,
    ring_buffers: int | None = None,
    register_fraction: float = 0.0,
    register_slice: int = REGISTER_SLICE,
    balance: bool = False,
    pin_threads: int = 1,
    prefault_threads: int = 0,
    hash_threads: int = 4,
    digest_on: str = "auto",
    url_spans: bool = True,
    url_ahead: bool = True,
    skip_marker: bool = True,
    phases: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One file onto a CUDA device: one allocation, tensors as views of aligned slots.

    ``register_fraction``: the share of a local file pinned in place (from its end), fixed;
    with ``balance`` it is the most, and the pinning thread and the readers meet wherever
    their rates put them (for a host whose pinning is slow, e.g. a tmpfs node cache; on three
    H200 hosts the fixed split at 0.5 was 5 % faster verified on average, because pinning
    slows the DMA of the ring's copies and a greedy meeting point does not see that;
    bench/results/engine.md). ``phases["registered_bytes"]`` says how much was pinned.

    ``pin_threads``: threads pinning slices from the back (on some hosts the driver pins
    faster from several); ``prefault_threads``: threads that fault the mapping's pages in
    ahead of them. Both measured in bench/results/engine.md.

    ``digest_on``: where chunk digests are checked when ``verify``: "device" (BLAKE3 on the
    GPU over the staged bytes, tensor_registry.engine.gpu_blake3), "host" (on ``hash_threads`` CPU
    threads), or "auto" (the device when its kernels can be built here and already ran in this
    process or the file is at least DEVICE_DIGESTS_FROM bytes, else the host).
    ``phases["digest_on"]`` says which.

    ``url_spans``: over a URL, one range request per span of blocks (``_Frontier``); False asks
    for each block on its own (kept for measurement, bench/url_ceiling.py). ``url_ahead``:
    each reader asks for its next span on a second connection while the current span's last
    block arrives; False: one connection, the next span asked once this one is read (kept for
    measurement too).

    ``phases`` also holds the readers' thread-seconds reading, waiting for a free buffer and
    issuing copies (``readers_read_s``, ``readers_wait_s``, ``readers_submit_s``), asking for
    spans (``readers_open_s``: request to response headers) and the pinning thread's issuing
    (``pin_submit_s``): where each side waited (bench/results/engine.md, runs 10-13); and
    [earliest, latest] over the readers of the seconds from the start to their first span's
    answer (``readers_first_s``) and to their last block read (``readers_done_s``): how the
    load starts and ends.

    One long function on purpose: its two workers (``reader_worker``, ``register_worker``) and
    ``scatter`` are closures over one load's state (device buffer, slot plan, ring, staging,
    runtime, digests, the shared failure flag and the timings) and its error path
    must wait for every copy before the device buffer is freed; as separate functions they would
    pass those ten things around.
    """
    import torch

    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    t0 = time.perf_counter()
    plan = slot_plan(file)
    dest = torch.empty(plan.total, dtype=torch.uint8, device=device)
    dest_base = dest.data_ptr()
    rt = runtime()
    if rt is None:
        raise RuntimeError("the CUDA runtime library (libcudart) was not found")
    # Small blocks for a local file only when nothing is pinned: while the pinning thread is in
    # cudaHostRegister every other CUDA call of the process waits, and eight times the copies
    # wait eight times as often (register 0.5: 35.9 GB/s with 8 MiB blocks against 40.7 with
    # 64 MiB, bench/results/engine.md, run 38).
    pins = path is not None and register_fraction > 0
    block = block_size_for(
        file, block_bytes or (FILE_BLOCK_BYTES if path is not None and not pins else BLOCK_BYTES)
    )
    size = file.size
    source = FileSource(Path(path)) if path is not None else None
    if source is None and url is None:
        raise ValueError("load_cuda needs a path or a url")
    if source is not None and os.fstat(source.fd).st_size < size:
        actual = os.fstat(source.fd).st_size
        source.close()
        raise short_read_error(file, 0, size, actual)
    # The pinning thread never goes below ``floor`` (a block boundary); the readers take the rest.
    floor = size
    if source is not None and register_fraction > 0:
        floor = int(size * (1 - min(1.0, register_fraction))) // block * block
    spread = readers if source is None and url_spans else 0
    frontier = _Frontier(size, block, floor, balance, spread=spread)
    register_slice = max(block, register_slice // block * block)
    ring_blocks = block_ranges(size if balance else floor, block)
    t = time.perf_counter()
    digests = _device_digests(file, device, digest_on) if verify else None
    tail = digests.host_tail() if digests is not None else None
    digests_s = time.perf_counter() - t
    # No ring when the pinning takes the whole file: a fresh process's ring is pinned memory
    # faulted in on a background thread, buffer by buffer, the readers starting on the first
    # one (pinned.py); it is kept for the process's next loads.
    ring = (
        shared_ring(ring_buffers or _ring_count(readers, len(ring_blocks)), block)
        if ring_blocks
        else None
    )
    # One device staging row per pinned buffer, for this load only (see shared_ring).
    staging_rows = (
        torch.empty((ring.count, block), dtype=torch.uint8, device=device)
        if digests is not None and ring is not None
        else None
    )
    failed = threading.Event()
    events_lock = threading.Lock()
    if phases is not None:
        phases["allocate_s"] = time.perf_counter() - t0
        phases["digest_setup_s"] = digests_s
        phases["ring_buffers"] = ring.count if ring is not None else 0
        phases["block_bytes"] = block
        phases["ring_filled"] = ring is not None and ring.complete.is_set()  # before this load

    def scatter(host: int, start: int, end: int, stream: int, staged: int | None = None) -> None:
        """Copy file bytes [start, end) from the pinned address ``host`` to their tensors'
        slots on ``stream`` (a handle); with the address of a device ``staged`` buffer:
        host → staged, hash the chunks there, then staged → slots. Every call through ctypes
        (tensor_registry.engine.copies), with addresses: the GIL is free while the driver queues
        each copy, and no torch call is made per block."""
        source = host
        if staged is not None and digests is not None:
            rt.copy(staged, host, end - start, stream)
            digests.hash_block(staged, start, end, stream=stream)
            source = staged
        for a, slot, length in slot_segments(plan, start, end):
            rt.copy(dest_base + slot, source + a - start, length, stream)

    def host_checks(start: int, view: memoryview) -> None:
        """The chunks the device does not hash: all of them, or the shorter last one."""
        if digests is None:
            verify_block(file, start, view)
        elif tail is not None and start <= tail[0] < start + len(view):
            verify_block(file, tail[0], view[tail[0] - start :])

    timings: dict[str, float] = {}
    # Per reader, seconds from the start: its first span answered, its last block read.
    marks: dict[str, list[float]] = {"readers_first_s": [], "readers_done_s": []}

    def reader_worker() -> None:
        """Claims blocks from the front and reads each into one of its own pinned buffers
        (READER_BUFFERS of them, taken from the ring and given back at the end), then queues
        the block's copies (and its digests) on that buffer's own stream: a buffer is refilled
        as soon as its last copy is done, and the next block's copy out of the other buffer
        never queues behind this block's hashing and scatter (with one stream per reader the
        verified load was 0.81 of the unverified one, run 35; with a stream per buffer 0.90-0.93,
        runs 36-37; bench/results/engine.md).

        Over a URL (``url_ahead``) a reader has two connections: while the last block of a span
        arrives on one, the next span is already asked for on the other, so the server's
        handling of that request overlaps this transfer."""
        connections: list[HTTPRangeReader] = []
        spent = {
            "readers_read_s": 0.0,
            "readers_wait_s": 0.0,
            "readers_submit_s": 0.0,
            "readers_open_s": 0.0,
        }
        answered: float | None = None  # when this reader's first span was answered
        mine: list[_Slot] = []
        assert ring is not None  # readers run only when the ring has blocks
        try:
            torch.cuda.set_device(device)
            if source is None:
                connections = [
                    HTTPRangeReader(url or "", size) for _ in range(2 if url_ahead else 1)
                ]
            spans: list[Callable[[int, int], Any]] = [c.span for c in connections]
            opens = [checked_reads(file, f) for f in spans or [source.span]]  # type: ignore[union-attr]
            ahead = len(connections) > 1
            on = 0  # the connection of the current span
            k = 0
            claim = frontier.front()
            while claim is not None and not failed.is_set():
                span_start, span_end = claim
                claim = None
                t = time.perf_counter()
                body = opens[on](span_start, span_end - span_start)
                spent["readers_open_s"] += time.perf_counter() - t
                if answered is None:
                    answered = time.perf_counter() - t0
                try:
                    for start in range(span_start, span_end, block):
                        if failed.is_set():
                            return
                        end = min(span_end, start + block)
                        if ahead and end == span_end:
                            claim = frontier.front()  # asked now, read after this block
                            if claim is not None:
                                connections[1 - on].ask(claim[0], claim[1] - claim[0])
                        t = time.perf_counter()
                        if len(mine) < READER_BUFFERS:
                            # The first blocks (while the ring fills) until this reader has its
                            # buffers; it waits for one only while it has none.
                            taken = ring.take() if not mine else ring.try_take()
                            if taken is not None:
                                buffer, index = taken
                                address = buffer.data_ptr()
                                mine.append(
                                    _Slot(
                                        buffer,
                                        index,
                                        address,
                                        memview_at(address, ring.size),
                                        staging_rows[index].data_ptr()
                                        if staging_rows is not None
                                        else None,
                                        torch.cuda.Stream(device).cuda_stream,
                                        rt.event(),
                                    )
                                )
                        slot = mine[k % len(mine)]
                        k += 1
                        if slot.recorded:
                            rt.wait(slot.event)
                        spent["readers_wait_s"] += time.perf_counter() - t
                        view = slot.view[: end - start]
                        t = time.perf_counter()
                        got = body.read_into(view)
                        spent["readers_read_s"] += time.perf_counter() - t
                        if got != end - start:
                            raise_short(file, start, view, got, verify)
                        t = time.perf_counter()
                        scatter(slot.address, start, end, slot.stream, slot.staged)
                        rt.record(slot.event, slot.stream)
                        slot.recorded = True
                        spent["readers_submit_s"] += time.perf_counter() - t
                        if verify:
                            host_checks(start, view)
                finally:
                    body.close()
                if ahead:
                    on = 1 - on
                else:
                    claim = frontier.front()
        except BaseException:
            failed.set()
            raise
        finally:
            for connection in connections:
                connection.close()
            done = time.perf_counter() - t0
            for held in mine:
                rt.sync(held.stream)  # the buffer's copies are done: it can go back
                rt.destroy(held.event)
                ring.give(held.buffer, held.index)
            with events_lock:
                for key, value in spent.items():
                    timings[key] = timings.get(key, 0.0) + value
                if answered is not None:
                    marks["readers_first_s"].append(answered)
                marks["readers_done_s"].append(done)

    registered: RegisteredFile | None = None
    pinning = [0.0]
    ahead = [size]

    def prefault() -> None:
        # From the end backwards, a slice at a time, ahead of the pinning threads; stops where
        # the readers' front or the floor is.
        assert registered is not None
        while not failed.is_set():
            with frontier.lock:
                end = min(ahead[0], frontier.hi)
                start = max(floor, end - register_slice)
                if end <= max(frontier.lo, floor):
                    return
                ahead[0] = start
            if not registered.populate(start, end):
                return

    def register_worker() -> None:
        assert registered is not None
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device).cuda_stream
        pending = []
        # Device staging for on-device digests: two slices, each reused after its scatter.
        staging: list[list[Any]] = (
            [
                [torch.empty(register_slice, dtype=torch.uint8, device=device), rt.event(), False]
                for _ in range(2)
            ]
            if digests is not None
            else []
        )
        with ThreadPoolExecutor(max_workers=max(1, hash_threads)) as hashers:
            try:
                k = 0
                while not failed.is_set():
                    claim = frontier.back(register_slice)
                    if claim is None:
                        break
                    start, end = claim
                    pin_started = time.perf_counter()
                    registered.pin(start, end)
                    with events_lock:
                        pinning[0] += time.perf_counter() - pin_started
                    staged = None
                    submit_started = time.perf_counter()
                    if staging:
                        row = staging[k % 2]
                        if row[2]:
                            rt.wait(row[1])
                        staged = row[0].data_ptr()
                    scatter(registered.address(start), start, end, stream, staged)
                    if staging:
                        rt.record(row[1], stream)
                        row[2] = True
                    with events_lock:
                        timings["pin_submit_s"] = timings.get("pin_submit_s", 0.0) + (
                            time.perf_counter() - submit_started
                        )
                    if verify and digests is not None:
                        host_checks(start, memview_at(registered.address(start), end - start))
                    elif verify:
                        view = memview_at(registered.address(start), end - start)
                        step = file.chunk_bytes * 2
                        pending += [
                            hashers.submit(
                                verify_block, file, s, view[s - start : min(end, s + step) - start]
                            )
                            for s in range(start, end, step)
                        ]
                    k += 1
                for f in pending:
                    f.result()
            except BaseException:
                failed.set()
                raise
            finally:
                rt.sync(stream)  # every slice's copies are done before it may be unpinned
                for row in staging:
                    rt.destroy(row[1])

    try:
        count = min(readers, max(1, len(ring_blocks)))
        jobs: list[Callable[[], None]] = [reader_worker] * (count if ring_blocks else 0)
        if floor < size:
            assert source is not None
            registered = RegisteredFile(source.fd, floor, size)
            jobs += [register_worker] * max(1, pin_threads)
            jobs += [prefault] * prefault_threads
        with ThreadPoolExecutor(max_workers=max(1, len(jobs)), thread_name_prefix="load") as pool:
            futures = [pool.submit(j) for j in jobs]
            errors = [f.exception() for f in futures]
        first = next((e for e in errors if isinstance(e, ChunkMismatch)), None) or next(
            (e for e in errors if e is not None), None
        )
        if first is not None:
            raise first
        if phases is not None:
            # Every worker synchronized its streams before it returned: the copies are done
            # once the last one is issued, and both names stand for that moment.
            phases["issued_s"] = phases["copied_s"] = time.perf_counter() - t0
            phases.update(timings)
            phases.update({k: [min(v), max(v)] for k, v in marks.items() if v})
        if digests is not None:
            bad = digests.mismatches()
            if bad:
                raise mismatch_error(file, bad[0])
        if phases is not None:
            phases["on_device_s"] = time.perf_counter() - t0
            if ring is not None:
                # How it was pinned, and how long the whole ring took to fill if it has.
                phases["ring_pinned"], phases["ring_fill_s"] = ring.how, ring.fill_s
            phases["digest_on"] = "device" if digests is not None else "host" if verify else "none"
            if floor < size:
                phases["pinning_s"] = pinning[0]
                phases["registered_bytes"] = frontier.registered
        if registered is not None:
            # Unpinning takes ~5-8 ms per GB and nothing waits for it: off the load's path.
            release_later(registered, source)
            registered = source = None
    except BaseException:
        # Copies may still be writing into ``dest``: let them finish before its memory is reused.
        torch.cuda.synchronize(device)
        del dest
        raise
    finally:
        if registered is not None:
            registered.close()
        if source is not None:
            source.close()
    if phases is not None:
        phases["returned_s"] = time.perf_counter() - t0
    return device_views(file, plan, dest, skip_marker=skip_marker)
