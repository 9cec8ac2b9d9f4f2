"""Filled ring buffers handed from the reader threads to one thread that issues their copies.

Why (bench/results/engine.md, run 10): while the pinning thread is inside
``cudaHostRegister`` a reader's own CUDA calls (its copies, the event it waits on before
refilling a buffer) can wait for the driver, so the readers stop reading while the pages are
pinned. Handed off, the readers make no CUDA call at all: they read into free buffers and queue
them; one thread issues every copy, and gives a buffer back to the ring only once its copy has
finished (``query``, never a wait a reader would share). Pure Python: the CUDA side comes in as
``submit`` and the events it returns (``query()``, ``synchronize()``), so this is tested
without a GPU.
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
    def give(self, buffer: Any, index: int, event: Any) -> None: ...


class Handoff:
    """``readers`` threads ``put`` (block number, start, end, buffer, index) and call ``done``
    once each; ``run`` (the submitting thread) calls ``submit`` for each item in arrival order
    and returns the ring's buffers as their copies finish. After ``failed`` is set the items
    still coming are handed back unsubmitted, so no reader waits forever for a buffer."""

    def __init__(
        self,
        readers: int,
        ring: _Ring,
        submit: Callable[[int, int, int, Any, int], _Event],
        failed: threading.Event,
    ) -> None:
        self.readers, self.ring, self.submit, self.failed = readers, ring, submit, failed
        self.ready: queue.SimpleQueue[tuple[int, int, int, Any, int] | None] = queue.SimpleQueue()
        self.events: list[_Event] = []
        self.submit_s = 0.0

    def put(self, n: int, start: int, end: int, buffer: Any, index: int) -> None:
        self.ready.put((n, start, end, buffer, index))

    def done(self) -> None:
        self.ready.put(None)

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
                try:
                    item = self.ready.get(timeout=POLL_S) if inflight else self.ready.get()
                except queue.Empty:
                    continue
                if item is None:
                    left -= 1
                    continue
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
                inflight.append((event, buffer, index))
        finally:
            # Every copy issued must finish before its buffer is refilled (by a later load).
            for event, buffer, index in inflight:
                event.synchronize()
                self.ring.give(buffer, index, None)
        if error is not None:
            raise error
