"""Loads onto a CUDA device: one allocation per file, every chunk verified on the way.

Each tensor gets a 256-byte aligned slot in the allocation (tensor_registry.engine.views) and every
block of file bytes is scattered to its tensors' slots by async copies. Blocks reach the device
two ways at once (local files): reader threads ``preadv`` blocks into pinned buffers of their
own, two each from the process's ring, and copy each block as soon as it is read, on that
buffer's stream (a CPU copy out of the page cache; 8 MiB blocks when nothing is pinned), while
one thread maps the tail of the file, pins its pages in place with ``cudaHostRegister``
(read-only) a slice at a time and copies them with no CPU copy at all (the driver's pinning and
the DMA engine; tensor_registry.engine.pinned). ``register_fraction`` splits the file between the
two (bench/RESULTS.md). Over a URL only the pinned ring runs, fed by HTTP range
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

from tensor_registry.engine import gpu_blake3, plan
from tensor_registry.engine.checks import (
    ChunkMismatch,
    checked_reads,
    mismatch_error,
    raise_short,
    short_read_error,
    verify_block,
)
from tensor_registry.engine.copies import runtime
from tensor_registry.engine.frontier import Frontier
from tensor_registry.engine.pinned import (
    READER_BUFFERS,
    RegisteredFile,
    memview_at,
    release_later,
    ring_count,
    ring_ready,
    shared_ring,
)
from tensor_registry.engine.sources import (
    BLOCK_BYTES,
    FileSource,
    HTTPRangeReader,
    block_ranges,
    block_size_for,
)
from tensor_registry.engine.views import device_views, slot_plan, slot_segments
from tensor_registry.formats.layout import FileLayout
from tensor_registry.loading import LoadOptions

DEFAULT_READERS = 16
# A local file's ring blocks (one 8 MiB chunk of the manifest's digests) and the pinned buffers
# each reader keeps for itself: a block goes to the device while the next is read, each
# reader cycling through 16 MiB. Page cache -> device through two 8 MiB buffers per thread
# carried 41-50 GB/s where 64 MiB ones carried 31-36 (bench/engine/cache_dma.py; bench/RESULTS.md),
# and the engine's ring-only load went from 33.6 to 39.9 GB/s verified, same host. A URL's
# blocks stay BLOCK_BYTES: over loopback TCP 8 MiB pieces carried no more (30.1 and 30.1, run
# 32).
FILE_BLOCK_BYTES = 8 << 20


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


def load_cuda(
    file: FileLayout,
    *,
    path: Path | str | None = None,
    url: str | None = None,
    device: Any = "cuda",
    options: LoadOptions | None = None,
    phases: dict[str, Any] | None = None,
    **given: Any,
) -> dict[str, Any]:
    """One file onto a CUDA device: one allocation, tensors as views of aligned slots.

    How it runs is ``options`` (tensor_registry.loading.LoadOptions, which says what each
    field means; keywords named as its fields change single ones). The steps (``_CudaLoad``):
    allocate the device buffer and plan the slots, open the source and split its blocks
    (``Frontier``), run the readers from the front and the pinning thread from the back until
    every block is on the device, compare the device digests, hand the pinned tail back off
    the load's path, and return the tensors as views. Here ``register_fraction`` None means
    the node decides (tensor_registry.engine.plan), and "auto" ``digest_on`` means the device
    once its kernels ran in this process or for a file of DEVICE_DIGESTS_FROM bytes
    (tensor_registry.engine.gpu_blake3).

    ``phases`` records what was chosen (``plan``, ``registered_bytes``, ``digest_on``) and
    where each side waited: the readers' thread-seconds reading, waiting for a buffer, issuing
    copies and asking for spans (``readers_read_s``, ``readers_wait_s``, ``readers_submit_s``,
    ``readers_open_s``), the pinning thread's issuing (``pin_submit_s``), and [earliest,
    latest] over the readers of the seconds to their first answer (``readers_first_s``) and
    their last block (``readers_done_s``).
    """
    opts = (options or LoadOptions()).given(**given)
    load = _CudaLoad(file, path=path, url=url, device=device, options=opts, phases=phases)
    try:
        load.run()
        load.compare_digests()
        load.release_pinned()
    except BaseException:
        load.abort()
        raise
    finally:
        load.close()
    return load.views(skip_marker=opts.skip_marker)


class _CudaLoad:
    """One load's state, shared by its workers: the device buffer and slot plan, the source,
    the frontier between readers and the pinning thread, the ring and its device staging rows,
    the digests, the shared failure flag and the timings."""

    def __init__(
        self,
        file: FileLayout,
        *,
        path: Path | str | None,
        url: str | None,
        device: Any,
        options: LoadOptions,
        phases: dict[str, Any] | None,
    ) -> None:
        import torch

        if path is None and url is None:
            raise ValueError("load_cuda needs a path or a url")
        self.t0 = time.perf_counter()
        self.file, self.url, self.verify = file, url, options.verify
        self.options = options
        self.readers = options.readers or DEFAULT_READERS
        self.pin_threads, self.prefault_threads = options.pin_threads, options.prefault_threads
        self.hash_threads = options.hash_threads
        self.phases = phases
        device = torch.device(device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        self.device = device
        self.plan = slot_plan(file)
        self.dest = torch.empty(self.plan.total, dtype=torch.uint8, device=device)
        self.dest_base = self.dest.data_ptr()
        rt = runtime()
        if rt is None:
            raise RuntimeError("the CUDA runtime library (libcudart) was not found")
        self.rt = rt
        self.source = self._open_source(path)
        self.registered: RegisteredFile | None = None
        fraction = options.register_fraction
        if fraction is None:
            fraction = self._plan(options)
        self._split(fraction, options.register_slice, options.block_bytes, options.balance)
        t = time.perf_counter()
        self.digests = (
            gpu_blake3.device_digests(file, device, options.digest_on) if self.verify else None
        )
        self.tail = self.digests.host_tail() if self.digests is not None else None
        digests_s = time.perf_counter() - t
        self._make_ring(options.ring_buffers)
        self.failed = threading.Event()
        self.lock = threading.Lock()
        self.timings: dict[str, float] = {}
        # Per reader, seconds from the start: its first span answered, its last block read.
        self.marks: dict[str, list[float]] = {"readers_first_s": [], "readers_done_s": []}
        self.pinning_s = 0.0
        self.prefaulted_to = file.size
        if phases is not None:
            phases["allocate_s"] = time.perf_counter() - self.t0
            phases["digest_setup_s"] = digests_s
            phases["ring_buffers"] = self.ring.count if self.ring is not None else 0
            phases["block_bytes"] = self.block
            # Whether the ring was filled before this load.
            phases["ring_filled"] = self.ring is not None and self.ring.complete.is_set()

    # -- setting up -------------------------------------------------------------------------

    def _plan(self, options: LoadOptions) -> float:
        """``register_fraction`` from what the node measured (tensor_registry.engine.plan):
        all of a local file pinned in place, or none; a URL pins nothing."""
        if self.source is None:
            return 0.0
        rates = plan.measure(self.source.fd, self.file.size, self.device)
        block = block_size_for(self.file, options.block_bytes or FILE_BLOCK_BYTES)
        count = options.ring_buffers or ring_count(self.readers, -(-self.file.size // block))
        choice = plan.choose(
            self.file.size,
            rates,
            readers=self.readers,
            ring_bytes=count * block,
            ring_ready=ring_ready(count, block),
        )
        if self.phases is not None:
            self.phases.update(choice.phases())
        return choice.register_fraction

    def _open_source(self, path: Path | str | None) -> FileSource | None:
        if path is None:
            return None
        source = FileSource(Path(path))
        actual = os.fstat(source.fd).st_size
        if actual < self.file.size:
            source.close()
            raise short_read_error(self.file, 0, self.file.size, actual)
        return source

    def _split(
        self, register_fraction: float, register_slice: int, block_bytes: int | None, balance: bool
    ) -> None:
        """The block size and where the readers and the pinning thread meet.

        Small blocks for a local file only when nothing is pinned: while the pinning thread is
        in cudaHostRegister every other CUDA call of the process waits, and eight times the
        copies wait eight times as often (bench/RESULTS.md). The pinning thread never goes
        below ``floor`` (a block boundary); the readers take the rest."""
        size = self.file.size
        pins = self.source is not None and register_fraction > 0
        local = self.source is not None
        default = FILE_BLOCK_BYTES if local and not pins else BLOCK_BYTES
        self.block = block = block_size_for(self.file, block_bytes or default)
        self.floor = size
        if pins:
            self.floor = int(size * (1 - min(1.0, register_fraction))) // block * block
        spread = self.readers if not local and self.options.url_spans else 0
        self.frontier = Frontier(size, block, self.floor, balance, spread=spread)
        self.register_slice = max(block, register_slice // block * block)
        self.ring_blocks = block_ranges(size if balance else self.floor, block)

    def _make_ring(self, ring_buffers: int | None) -> None:
        """No ring when the pinning takes the whole file: a fresh process's ring is pinned
        memory faulted in on a background thread, buffer by buffer, the readers starting on the
        first one (pinned.py); it is kept for the process's next loads. With device digests,
        one device staging row per pinned buffer, for this load only."""
        import torch

        self.ring = (
            shared_ring(ring_buffers or ring_count(self.readers, len(self.ring_blocks)), self.block)
            if self.ring_blocks
            else None
        )
        self.staging_rows = (
            torch.empty((self.ring.count, self.block), dtype=torch.uint8, device=self.device)
            if self.digests is not None and self.ring is not None
            else None
        )

    # -- what both paths do with a block ----------------------------------------------------

    def scatter(self, host: int, start: int, end: int, stream: int, staged: int | None) -> None:
        """Copy file bytes [start, end) from the pinned address ``host`` to their tensors'
        slots on ``stream`` (a handle); with the address of a device ``staged`` buffer:
        host → staged, hash the chunks there, then staged → slots. Every call through ctypes
        (tensor_registry.engine.copies), with addresses: the GIL is free while the driver queues
        each copy, and no torch call is made per block."""
        source = host
        if staged is not None and self.digests is not None:
            self.rt.copy(staged, host, end - start, stream)
            self.digests.hash_block(staged, start, end, stream=stream)
            source = staged
        for a, slot, length in slot_segments(self.plan, start, end):
            self.rt.copy(self.dest_base + slot, source + a - start, length, stream)

    def host_checks(self, start: int, view: memoryview) -> None:
        """The chunks the device does not hash: all of them, or the shorter last one."""
        if self.digests is None:
            verify_block(self.file, start, view)
        elif self.tail is not None and start <= self.tail[0] < start + len(view):
            verify_block(self.file, self.tail[0], view[self.tail[0] - start :])

    def _add_timings(self, spent: dict[str, float]) -> None:
        with self.lock:
            for key, value in spent.items():
                self.timings[key] = self.timings.get(key, 0.0) + value

    # -- the readers: blocks from the front into pinned ring buffers --------------------------

    def read_front(self) -> None:
        """Claims blocks from the front and reads each into one of its own pinned buffers
        (READER_BUFFERS of them, taken from the ring and given back at the end), then queues
        the block's copies (and its digests) on that buffer's own stream: a buffer is refilled
        as soon as its last copy is done, and the next block's copy out of the other buffer
        never queues behind this block's hashing and scatter (with one stream per reader the
        verified load was clearly slower than the unverified one; bench/RESULTS.md).

        Over a URL (``LoadOptions.url_ahead``) a reader has two connections: while the last block
        of a span arrives on one, the next span is already asked for on the other, so the
        server's handling of that request overlaps this transfer."""
        import torch

        connections: list[HTTPRangeReader] = []
        spent = dict.fromkeys(
            ("readers_read_s", "readers_wait_s", "readers_submit_s", "readers_open_s"), 0.0
        )
        answered: float | None = None  # when this reader's first span was answered
        mine: list[_Slot] = []
        try:
            torch.cuda.set_device(self.device)
            if self.source is None:
                count = 2 if self.options.url_ahead else 1
                connections = [
                    HTTPRangeReader(self.url or "", self.file.size) for _ in range(count)
                ]
            spans: list[Callable[[int, int], Any]] = [c.span for c in connections]
            opens = [checked_reads(self.file, f) for f in spans or [self.source.span]]  # type: ignore[union-attr]
            ahead = len(connections) > 1
            on = 0  # the connection of the current span
            claim = self.frontier.front()
            while claim is not None and not self.failed.is_set():
                span_start, span_end = claim
                t = time.perf_counter()
                body = opens[on](span_start, span_end - span_start)
                spent["readers_open_s"] += time.perf_counter() - t
                if answered is None:
                    answered = time.perf_counter() - self.t0
                try:
                    claim = self._read_span(
                        body, claim, mine, spent, connections[1 - on] if ahead else None
                    )
                finally:
                    body.close()
                if ahead:
                    on = 1 - on
                elif not self.failed.is_set():
                    claim = self.frontier.front()
        except BaseException:
            self.failed.set()
            raise
        finally:
            for connection in connections:
                connection.close()
            done = time.perf_counter() - self.t0
            self._give_back(mine)
            self._add_timings(spent)
            with self.lock:
                if answered is not None:
                    self.marks["readers_first_s"].append(answered)
                self.marks["readers_done_s"].append(done)

    def _read_span(
        self,
        body: Any,
        span: tuple[int, int],
        mine: list[_Slot],
        spent: dict[str, float],
        other: HTTPRangeReader | None,
    ) -> tuple[int, int] | None:
        """Reads one span's blocks out of ``body``, each into the reader's next buffer, and
        queues its copies. With ``other`` (the reader's second connection) the next span is
        claimed and asked for there when the last block starts, and returned."""
        span_start, span_end = span
        following: tuple[int, int] | None = None
        for start in range(span_start, span_end, self.block):
            if self.failed.is_set():
                return None
            end = min(span_end, start + self.block)
            if other is not None and end == span_end:
                following = self.frontier.front()  # asked now, read after this block
                if following is not None:
                    other.ask(following[0], following[1] - following[0])
            t = time.perf_counter()
            slot = self._next_slot(mine)
            if slot.recorded:
                self.rt.wait(slot.event)
            spent["readers_wait_s"] += time.perf_counter() - t
            view = slot.view[: end - start]
            t = time.perf_counter()
            got = body.read_into(view)
            spent["readers_read_s"] += time.perf_counter() - t
            if got != end - start:
                raise_short(self.file, start, view, got, self.verify)
            t = time.perf_counter()
            self.scatter(slot.address, start, end, slot.stream, slot.staged)
            self.rt.record(slot.event, slot.stream)
            slot.recorded = True
            spent["readers_submit_s"] += time.perf_counter() - t
            if self.verify:
                self.host_checks(start, view)
        return following

    def _next_slot(self, mine: list[_Slot]) -> _Slot:
        """The reader's buffer for its next block. Until it holds READER_BUFFERS (while the
        ring fills) it takes another when one is free; it waits for one only while it has
        none, so loads sharing a smaller ring never deadlock."""
        import torch

        ring = self.ring
        assert ring is not None  # readers run only when the ring has blocks
        if len(mine) < READER_BUFFERS:
            taken = ring.take() if not mine else ring.try_take()
            if taken is not None:
                buffer, index = taken
                address = buffer.data_ptr()
                staged = (
                    self.staging_rows[index].data_ptr() if self.staging_rows is not None else None
                )
                stream = torch.cuda.Stream(self.device).cuda_stream
                view = memview_at(address, ring.size)
                # A buffer just taken goes first: nothing is queued on it yet.
                mine.insert(0, _Slot(buffer, index, address, view, staged, stream, self.rt.event()))
        # Round robin over the buffers held: the next block takes the one used longest ago.
        slot = mine.pop(0)
        mine.append(slot)
        return slot

    def _give_back(self, mine: list[_Slot]) -> None:
        assert self.ring is not None or not mine
        for held in mine:
            self.rt.sync(held.stream)  # the buffer's copies are done: it can go back
            self.rt.destroy(held.event)
            self.ring.give(held.buffer, held.index)  # type: ignore[union-attr]

    # -- the pinning thread: slices from the back, pinned in place ----------------------------

    def prefault(self) -> None:
        """From the end backwards, a slice at a time, ahead of the pinning threads; stops where
        the readers' front or the floor is."""
        assert self.registered is not None
        while not self.failed.is_set():
            with self.frontier.lock:
                end = min(self.prefaulted_to, self.frontier.hi)
                start = max(self.floor, end - self.register_slice)
                if end <= max(self.frontier.lo, self.floor):
                    return
                self.prefaulted_to = start
            if not self.registered.populate(start, end):
                return

    def pin_back(self) -> None:
        """Takes slices from the back, pins each in place and scatters it (through a device
        staging slice when the device hashes); host digests go to ``hash_threads``."""
        import torch

        assert self.registered is not None
        torch.cuda.set_device(self.device)
        stream = torch.cuda.Stream(self.device).cuda_stream
        pending: list[Any] = []
        # Device staging for on-device digests: two slices, each reused after its scatter.
        staging: list[list[Any]] = (
            [
                [
                    torch.empty(self.register_slice, dtype=torch.uint8, device=self.device),
                    self.rt.event(),
                    False,
                ]
                for _ in range(2)
            ]
            if self.digests is not None
            else []
        )
        with ThreadPoolExecutor(max_workers=max(1, self.hash_threads)) as hashers:
            try:
                k = 0
                while not self.failed.is_set():
                    claim = self.frontier.back(self.register_slice)
                    if claim is None:
                        break
                    row = staging[k % 2] if staging else None
                    self._pin_slice(claim, stream, row)
                    if self.verify:
                        pending += self._check_slice(claim, hashers)
                    k += 1
                for f in pending:
                    f.result()
            except BaseException:
                self.failed.set()
                raise
            finally:
                self.rt.sync(stream)  # every slice's copies are done before it may be unpinned
                for row in staging:
                    self.rt.destroy(row[1])

    def _pin_slice(self, claim: tuple[int, int], stream: int, row: list[Any] | None) -> None:
        assert self.registered is not None
        start, end = claim
        pin_started = time.perf_counter()
        self.registered.pin(start, end)
        with self.lock:
            self.pinning_s += time.perf_counter() - pin_started
        submit_started = time.perf_counter()
        staged = None
        if row is not None:
            if row[2]:
                self.rt.wait(row[1])
            staged = row[0].data_ptr()
        self.scatter(self.registered.address(start), start, end, stream, staged)
        if row is not None:
            self.rt.record(row[1], stream)
            row[2] = True
        self._add_timings({"pin_submit_s": time.perf_counter() - submit_started})

    def _check_slice(self, claim: tuple[int, int], hashers: ThreadPoolExecutor) -> list[Any]:
        """The host's share of a pinned slice's digests: with device digests only the shorter
        last chunk (checked here); else every chunk, two at a time on the hashing threads."""
        assert self.registered is not None
        start, end = claim
        view = memview_at(self.registered.address(start), end - start)
        if self.digests is not None:
            self.host_checks(start, view)
            return []
        step = self.file.chunk_bytes * 2
        return [
            hashers.submit(verify_block, self.file, s, view[s - start : min(end, s + step) - start])
            for s in range(start, end, step)
        ]

    # -- running and ending -----------------------------------------------------------------

    def run(self) -> None:
        """Every worker to its end; the first chunk mismatch (else the first error) is raised."""
        count = min(self.readers, max(1, len(self.ring_blocks)))
        jobs: list[Callable[[], None]] = [self.read_front] * (count if self.ring_blocks else 0)
        if self.floor < self.file.size:
            assert self.source is not None
            self.registered = RegisteredFile(self.source.fd, self.floor, self.file.size)
            jobs += [self.pin_back] * max(1, self.pin_threads)
            jobs += [self.prefault] * self.prefault_threads
        with ThreadPoolExecutor(max_workers=max(1, len(jobs)), thread_name_prefix="load") as pool:
            futures = [pool.submit(j) for j in jobs]
            errors = [f.exception() for f in futures]
        first = next((e for e in errors if isinstance(e, ChunkMismatch)), None) or next(
            (e for e in errors if e is not None), None
        )
        if first is not None:
            raise first
        if self.phases is not None:
            # Every worker synchronized its streams before it returned: the copies are done
            # once the last one is issued, and both names stand for that moment.
            self.phases["issued_s"] = self.phases["copied_s"] = time.perf_counter() - self.t0
            self.phases.update(self.timings)
            self.phases.update({k: [min(v), max(v)] for k, v in self.marks.items() if v})

    def compare_digests(self) -> None:
        if self.digests is not None:
            bad = self.digests.mismatches()
            if bad:
                raise mismatch_error(self.file, bad[0])
        phases = self.phases
        if phases is not None:
            phases["on_device_s"] = time.perf_counter() - self.t0
            if self.ring is not None:
                # How it was pinned, and how long the whole ring took to fill if it has.
                phases["ring_pinned"], phases["ring_fill_s"] = self.ring.how, self.ring.fill_s
            verified = "host" if self.verify else "none"
            phases["digest_on"] = "device" if self.digests is not None else verified
            if self.floor < self.file.size:
                phases["pinning_s"] = self.pinning_s
                phases["registered_bytes"] = self.frontier.registered

    def release_pinned(self) -> None:
        """Unpinning takes ~5-8 ms per GB and nothing waits for it: off the load's path."""
        if self.registered is not None:
            release_later(self.registered, self.source)
            self.registered = self.source = None

    def abort(self) -> None:
        """Copies may still be writing into the device buffer: let them finish before its
        memory is reused."""
        import torch

        torch.cuda.synchronize(self.device)
        del self.dest

    def close(self) -> None:
        if self.registered is not None:
            self.registered.close()
        if self.source is not None:
            self.source.close()

    def views(self, *, skip_marker: bool) -> dict[str, Any]:
        if self.phases is not None:
            self.phases["returned_s"] = time.perf_counter() - self.t0
        return device_views(self.file, self.plan, self.dest, skip_marker=skip_marker)
