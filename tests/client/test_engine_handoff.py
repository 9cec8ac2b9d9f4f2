"""Readers hand filled ring buffers to one submitting thread (app.client.engine.handoff).

The submitter must issue every block once, give a buffer back to the ring only after its copy
has finished (else a reader refills bytes the DMA is still reading), and after a failure hand
every buffer back unsubmitted so no reader waits forever. Pure Python, with fake events that
finish when the test says so: runs without a GPU."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from app.client.engine.handoff import Handoff


class FakeEvent:
    def __init__(self, name: str) -> None:
        self.name = name
        self.finished = threading.Event()

    def query(self) -> bool:
        return self.finished.is_set()

    def synchronize(self) -> None:
        self.finished.wait(10)
        assert self.finished.is_set()


class FakeRing:
    """Buffers 0..count-1; ``give`` checks that a returned buffer's copy is finished."""

    def __init__(self, count: int, events: dict[int, FakeEvent]) -> None:
        self.free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(count):
            self.free.put(index)
        self.events = events
        self.given: list[int] = []
        self.early: list[int] = []

    def take(self) -> int:
        return self.free.get(timeout=10)

    def give(self, buffer: Any, index: int, event: Any) -> None:
        assert event is None
        pending = self.events.get(index)
        if pending is not None and not pending.finished.is_set():
            self.early.append(index)
        self.given.append(index)
        self.free.put(index)


def _readers(handoff: Handoff, ring: FakeRing, blocks: list[int], count: int) -> list[Any]:
    claims = iter(blocks)
    lock = threading.Lock()

    def reader() -> None:
        try:
            while not handoff.failed.is_set():
                with lock:
                    n = next(claims, None)
                if n is None:
                    return
                index = ring.take()
                handoff.put(n, n * 10, n * 10 + 10, f"buffer{index}", index)
        finally:
            handoff.done()

    threads = [threading.Thread(target=reader) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def test_every_block_is_submitted_once_and_buffers_return_only_after_their_copy() -> None:
    events: dict[int, FakeEvent] = {}
    ring = FakeRing(3, events)
    submitted: list[int] = []
    # Copies "finish" on a thread of their own, a little after they are issued, in order.
    finisher: queue.SimpleQueue[FakeEvent] = queue.SimpleQueue()

    def finish() -> None:
        while (event := finisher.get()) is not None:
            event.finished.set()

    def submit(n: int, start: int, end: int, buffer: Any, index: int) -> FakeEvent:
        assert (start, end) == (n * 10, n * 10 + 10) and buffer == f"buffer{index}"
        submitted.append(n)
        event = events[index] = FakeEvent(f"block{n}")
        finisher.put(event)
        return event

    failed = threading.Event()
    handoff = Handoff(4, ring, submit, failed)
    worker = threading.Thread(target=finish)
    worker.start()
    readers = _readers(handoff, ring, list(range(40)), 4)
    handoff.run()
    for t in readers:
        t.join(10)
    finisher.put(None)  # type: ignore[arg-type]
    worker.join(10)
    assert sorted(submitted) == list(range(40))
    assert len(handoff.events) == 40 and all(e.finished.is_set() for e in handoff.events)
    assert ring.early == []  # no buffer went back while its copy was still reading it
    assert len(ring.given) == 40 and not failed.is_set()


def test_a_buffer_whose_copy_never_finishes_is_never_refilled() -> None:
    """Two buffers, the first copy held back: the submitter must wait for it (at the end)
    rather than give its buffer to a reader, and meanwhile keep recycling the other one
    (copies on several streams finish out of order)."""
    events: dict[int, FakeEvent] = {}
    ring = FakeRing(2, events)
    held = FakeEvent("held")

    def submit(n: int, start: int, end: int, buffer: Any, index: int) -> FakeEvent:
        event = held if n == 0 else FakeEvent(f"block{n}")
        if n:
            event.finished.set()
        events[index] = event
        return event

    handoff = Handoff(1, ring, submit, threading.Event())
    runner = threading.Thread(target=handoff.run)
    readers = _readers(handoff, ring, [0, 1, 2, 3], 1)
    runner.start()
    # Blocks 1-3 cycle through the second buffer; the first stays with block 0's copy.
    for t in readers:
        t.join(10)
    assert not held.finished.is_set() and runner.is_alive()
    assert ring.given.count(0) == 0
    held.finished.set()
    runner.join(10)
    assert not runner.is_alive() and ring.early == [] and ring.given.count(0) == 1


def test_a_failed_submit_hands_every_buffer_back_and_is_raised() -> None:
    events: dict[int, FakeEvent] = {}
    ring = FakeRing(2, events)
    submitted: list[int] = []

    def submit(n: int, start: int, end: int, buffer: Any, index: int) -> FakeEvent:
        if len(submitted) == 3:
            raise RuntimeError("copy failed")
        submitted.append(n)
        event = events[index] = FakeEvent(f"block{n}")
        event.finished.set()
        return event

    failed = threading.Event()
    handoff = Handoff(3, ring, submit, failed)
    readers = _readers(handoff, ring, list(range(100)), 3)
    with pytest.raises(RuntimeError, match="copy failed"):
        handoff.run()
    for t in readers:
        t.join(10)
        assert not t.is_alive()  # no reader left waiting for a buffer
    assert failed.is_set() and len(submitted) == 3
    # Both buffers are back in the ring.
    assert sorted([ring.take(), ring.take()]) == [0, 1]


def test_with_tickets_buffers_go_back_at_once_carrying_their_ticket() -> None:
    events: dict[int, FakeEvent] = {}
    given: list[tuple[int, Any]] = []

    class TicketRing(FakeRing):
        def give(self, buffer: Any, index: int, done: Any) -> None:
            given.append((index, done))
            self.free.put(index)

    ring = TicketRing(2, events)

    def submit(n: int, start: int, end: int, buffer: Any, index: int) -> FakeEvent:
        return FakeEvent(f"block{n}")  # never finishes: tickets must not wait for events

    handoff = Handoff(2, ring, submit, threading.Event(), release=lambda n: 1000 + n)
    readers = _readers(handoff, ring, list(range(12)), 2)
    handoff.run()
    for t in readers:
        t.join(10)
    assert sorted(done for _, done in given) == [1000 + n for n in range(12)]
    assert handoff.idle.is_set()  # done: the pinning thread is never held back


def test_the_ring_refills_a_ticketed_buffer_only_once_its_stream_wrote_the_ticket() -> None:
    from app.client.engine.pinned import _PinnedRing

    ring = _PinnedRing(1, 16, pin_memory=False)
    buffer, index = ring.take()
    first = ring.reserve(3)
    assert ring.reserve(1) == first + 3  # a later load never reuses a ticket
    ring.give(buffer, index, first + 1)
    taken = threading.Event()

    def reader() -> None:
        ring.take()
        taken.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert not taken.wait(0.05)  # the flag still holds an older value
    ring.flags[index] = first  # not this ticket either
    assert not taken.wait(0.05)
    ring.flags[index] = first + 1  # what the stream writes after the buffer's copies
    assert taken.wait(10)
    thread.join(10)
