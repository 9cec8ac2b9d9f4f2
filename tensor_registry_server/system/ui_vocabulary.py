"""The web UI's copy of the vocabulary, made from the library's formats when the app starts:
``/ui/js/vocabulary.js`` exports the dtypes, formats and event types, so the UI spells none of
them itself (tests/test_vocabulary.py fails on a copy)."""

from __future__ import annotations

import json

from tensor_registry.formats.events import EVENT_TYPES
from tensor_registry.formats.variant import DTYPES, FORMATS


def vocabulary_js() -> str:
    lines = [
        "// Made by the server from tensor_registry/formats (tensor_registry_server/system/"
        "ui_vocabulary.py); not a file on disk.",
        f"export const DTYPES = Object.freeze({json.dumps(list(DTYPES))});",
        f"export const FORMATS = Object.freeze({json.dumps(list(FORMATS))});",
        f"export const EVENT_TYPES = Object.freeze({json.dumps(list(EVENT_TYPES))});",
    ]
    return "\n".join(lines) + "\n"
