"""The events stream: GET /api/v1/events (server-sent events over the outbox)."""
