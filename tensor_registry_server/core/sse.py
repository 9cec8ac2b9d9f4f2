"""Server-sent events framing, shared by the job progress stream and the events stream."""

from __future__ import annotations

KEEPALIVE = ": keepalive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(event: str, data: str, event_id: int | str) -> str:
    """One SSE message; ``data`` must be a single line (JSON without indentation is)."""
    return f"id: {event_id}\nevent: {event}\ndata: {data}\n\n"
