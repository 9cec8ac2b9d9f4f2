"""What every open server-sent event stream obeys (``GET /api/v1/events`` and
``GET /api/v1/jobs/{id}/events``), in one place:

- one cap per token and process for both kinds together (``StreamSlots``,
  ``http.max_event_streams_per_token``; 429 ``too_many_event_streams`` past it);
- a stream ends within ``http.stream_token_check_seconds`` of its token being revoked or
  expiring (``guarded``: the token is checked again at that interval, whatever the stream is
  waiting for, so keepalives never hold a dead token's stream open).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tensor_registry_server.core.errors import AppError

log = logging.getLogger("tensor_registry.streams")


class TooManyStreams(AppError):
    status, code, title = 429, "too_many_event_streams", "Too many event streams"


class StreamSlots:
    """Open event streams per token, in this process."""

    def __init__(self, per_token: int) -> None:
        self.per_token = per_token
        self._open: dict[uuid.UUID, int] = {}

    def take(self, token_id: uuid.UUID) -> Callable[[], None]:
        """A slot for ``token_id`` (429 past the cap); returns its idempotent release."""
        held = self._open.get(token_id, 0)
        if held >= self.per_token:
            raise TooManyStreams(
                f"This token already has {held} open event streams here (the most allowed, "
                "http.max_event_streams_per_token, counting events and job streams); close one "
                "first.",
                headers={"Retry-After": "5"},
                limit=self.per_token,
            )
        self._open[token_id] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._open.get(token_id, 1) - 1
            if left > 0:
                self._open[token_id] = left
            else:
                self._open.pop(token_id, None)

        return release

    def held(self, token_id: uuid.UUID) -> int:
        return self._open.get(token_id, 0)


def slots_of(state: Any, per_token: int) -> StreamSlots:
    """The process's one ``StreamSlots`` (kept on the app's state, made on first use)."""
    slots = getattr(state, "stream_slots", None)
    if slots is None:
        slots = state.stream_slots = StreamSlots(per_token)
    return slots


async def guarded(
    stream: AsyncIterator[str],
    *,
    still_valid: Callable[[], Awaitable[bool]],
    every: float,
    release: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[str]:
    """``stream``'s chunks while ``still_valid()`` says yes, asked every ``every`` seconds (by
    ``clock``) even while ``stream`` waits; ends the stream (closing it) at the first no.
    ``release`` (its slot) is called at the end, however it ends."""
    pending: asyncio.Future[str] | None = None
    checked = clock()
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(stream))
            wait = max(0.0, checked + every - clock())
            done, _ = await asyncio.wait({pending}, timeout=wait)
            if done:
                finished, pending = pending, None
                try:
                    chunk = finished.result()
                except StopAsyncIteration:
                    return
                yield chunk
            if clock() - checked >= every:
                checked = clock()
                if not await still_valid():
                    log.info("event stream ended: its token was revoked or expired")
                    return
    finally:
        # No await before the release: a cancelled request (anyio cancels at every await once
        # its client hung up) would never reach it.
        if release is not None:
            release()
        if pending is not None:
            pending.cancel()  # the inner stream ends (its own cleanup runs) in that task
        else:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
