"""One log format for every process of the registry: one JSON object per line on stderr.

Each line has ``ts`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``; a message that is
itself a JSON object (the access log's request lines) is merged in instead of quoted, and the
request id of the request being served is added when there is one. Tracebacks go into ``exc``
as one string, so a multi-line traceback is still one line. Python warnings are routed through
logging (``py.warnings``) so they come out in the same format. The worker's Celery output is
brought into it by ``tensor_registry_server.jobs.worker.main``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from tensor_registry_server.core.context import request_id_var


def _timestamp(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


def json_line(*, level: str, logger: str, created: float, **fields: Any) -> str:
    entry: dict[str, Any] = {"ts": _timestamp(created), "level": level, "logger": logger}
    entry.update(fields)
    return json.dumps(entry, default=str)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        fields: dict[str, Any] = {}
        if message.startswith("{") and message.endswith("}"):
            try:
                parsed = json.loads(message)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                fields.update(parsed)
        if not fields:
            fields["message"] = message
        request_id = request_id_var.get()
        if request_id and "request_id" not in fields:
            fields["request_id"] = request_id
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json_line(
            level=record.levelname.lower(), logger=record.name, created=record.created, **fields
        )


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """JSON lines on stderr for the root logger; every library logger propagates to it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)
