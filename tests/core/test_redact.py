"""The one redaction rule: no userinfo, no query string, no fragment."""

from __future__ import annotations

import pytest

from tensor_registry_server.core.redact import redact_uri


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (
            "https://user:password@models.example/a/manifest.json?X-Amz-Signature=abc#frag",
            "https://models.example/a/manifest.json",
        ),
        ("https://tok@models.example:8443/m.json", "https://models.example:8443/m.json"),
        ("s3://bucket/prefix/?versionId=1", "s3://bucket/prefix/"),
        ("file:///imports/llama", "file:///imports/llama"),
        ("http://[::1]:8080/x?token=1", "http://[::1]:8080/x"),
        ("http://[::1/x", "[unparseable uri]"),
    ],
)
def test_credentials_never_survive_redaction(raw: str, shown: str) -> None:
    assert redact_uri(raw) == shown
