"""Filled ring buffers handed from the reader threads to one thread that issues their copies.

Why (bench/results/engine.md, run 10): while the pinning thread is inside
``cudaHostRegister``, every other CUDA call of the process waits (issuing a copy waited up to
180 ms; a copy loop in another process was not slowed at all), so readers that issue their own
copies stop reading while the pages are pinned. Handed off, the readers make no CUDA call:
they read into free buffers and queue them; one thread issues every copy. A buffer goes back
to the ring either at once with a ticket its stream writes into pinned memory when the copy is
done (``release``; the ring's readers poll memory, app.client.engine.pinned), or, without
tickets, once the copy's event says it finished. ``idle`` is set while the submitter has
nothing to issue: the pinning thread waits for it (briefly) before it enters the driver, so
the queued blocks are issued between two slices instead of after the next one.

Pure Python: the CUDA side comes in as ``submit`` and the events it returns (``query()``,
``synchronize()``), so this is tested without a GPU.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

POLL_S = 0.0005  # how long the submitter waits for a filled buffer before it looks at its copies


class _Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class _Ring(Protocol):
    def give(self, buffer: Any, index: int, done: Any) -> None: ...


class Handoff:
    """``readers`` threads ``put`` (block number, start, end, buffer, index) and call ``done``
    once each; ``run`` (the submitting thread) calls ``submit`` for each item in arrival order
    and returns the ring's buffers (with ``release(n)``'s ticket at once, else as their copies
    finish). After ``failed`` is set the items still coming are handed back unsubmitted, so
    no reader waits forever for a buffer."""

    def __init__(
        self,
        readers: int,
        ring: _Ring,
        submit: Callable[[int, int, int, Any, int], _Event],
        failed: threading.Event,
        release: Callable[[int], Any] | None = None,
    ) -> None:
        self.readers, self.ring, self.submit, self.failed = readers, ring, submit, failed
        self.release = release
        self.ready: queue.SimpleQueue[tuple[int, int, int, Any, int] | None] = queue.SimpleQueue()
        self.events: list[_Event] = []
        self.submit_s = 0.0
        self.idle = threading.Event()

    def put(self, n: int, start: int, end: int, buffer: Any, index: int) -> None:
        self.ready.put((n, start, end, buffer, index))

    def done(self) -> None:
        self.ready.put(None)

    def _next(self, waiting: bool) -> tuple[int, int, int, Any, int] | bool | None:
        """The next item, None for a reader that finished, False when none came in POLL_S."""
        try:
            return self.ready.get_nowait()
        except queue.Empty:
            pass
        self.idle.set()
        try:
            return self.ready.get(timeout=POLL_S) if waiting else self.ready.get()
        except queue.Empty:
            return False
        finally:
            self.idle.clear()

    def run(self) -> None:
        inflight: list[tuple[_Event, Any, int]] = []
        left = self.readers
        error: BaseException | None = None
        try:
            while left:
                # Copies on several streams finish out of order: any finished one frees its
                # buffer, not only the oldest.
                still = []
                for entry in inflight:
                    if entry[0].query():
                        self.ring.give(entry[1], entry[2], None)
                    else:
                        still.append(entry)
                inflight = still
                item = self._next(bool(inflight))
                if item is False:
                    continue
                if item is None:
                    left -= 1
                    continue
                assert isinstance(item, tuple)
                n, start, end, buffer, index = item
                if self.failed.is_set():
                    self.ring.give(buffer, index, None)
                    continue
                t = time.perf_counter()
                try:
                    event = self.submit(n, start, end, buffer, index)
                except BaseException as exc:
                    error = error or exc
                    self.failed.set()
                    self.ring.give(buffer, index, None)
                    continue
                self.submit_s += time.perf_counter() - t
                self.events.append(event)
                if self.release is not None:
                    self.ring.give(buffer, index, self.release(n))
                else:
                    inflight.append((event, buffer, index))
        finally:
            self.idle.set()  # nothing more to issue: never hold the pinning thread back
            # Every copy issued must finish before its buffer is refilled (by a later load).
            for event, buffer, index in inflight:
                event.synchronize()
                self.ring.give(buffer, index, None)
        if error is not None:
            raise error
