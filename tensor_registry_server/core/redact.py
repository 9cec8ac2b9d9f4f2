"""The one redaction rule for URIs shown, logged, audited or stored for display.

A source URI may carry credentials in two places: ``user:password@`` before the host and a query
string (presigned S3/GCS URLs put ``X-Amz-Signature``/``X-Amz-Credential`` there, other stores a
``token=``). The rule drops both, and the fragment: ``scheme://host[:port]/path``. The path stays
(it is what a reader needs to recognise the source). The raw URI is kept only where a job needs it
to fetch (the ``source_uri`` column of the version or artifact row) and is never returned.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

UNPARSEABLE = "[unparseable uri]"


def redact_uri(uri: str) -> str:
    """``uri`` without userinfo, query string and fragment."""
    try:
        parts = urlsplit(uri)
        netloc = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return UNPARSEABLE


def redact_value(value: object) -> object:
    """``redact_uri`` for strings; anything else as it is (job params are loosely typed)."""
    return redact_uri(value) if isinstance(value, str) else value
