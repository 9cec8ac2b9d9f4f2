"""The registry's event types: what the outbox records, the stream and webhooks deliver, and
the node agent follows. One spelling, read by the server (tensor_registry_server.core.
events_outbox), the agent and the web UI (ui/js/vocabulary.js, generated from here)."""

from __future__ import annotations

EVENT_TYPES: tuple[str, ...] = (
    "alias.moved",
    "alias.deleted",
    "version.ready",
    "version.deleted",
    "artifact.ready",
    "artifact.deleted",
    "job.failed",
    "webhook.disabled",
)
# The events about an alias (a watch of that alias follows them).
ALIAS_EVENT_TYPES: tuple[str, ...] = ("alias.moved", "alias.deleted")
# The events that can change what a node's watch resolves to (the agent follows these).
WATCH_EVENT_TYPES: tuple[str, ...] = (
    "alias.moved",
    "alias.deleted",
    "version.ready",
    "artifact.ready",
    "artifact.deleted",
)
