"""Reading a subprocess's output in tests without ever hanging."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any


class LineReader:
    """Reads a stream on a thread, so a wait for a line fails after its timeout, never hangs."""

    def __init__(self, stream: Any) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []

        def pump() -> None:
            for line in iter(stream.readline, ""):
                self.queue.put(line)
            self.queue.put(None)

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if needle in line:
                return
        raise AssertionError(f"{needle!r} never came: {self.seen}")

    def text(self, timeout: float = 60) -> str:
        """Everything, once the stream has ended."""
        self.thread.join(timeout)
        while not self.queue.empty():
            line = self.queue.get()
            if line is not None:
                self.seen.append(line)
        return "".join(self.seen)
