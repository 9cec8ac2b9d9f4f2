"""A source that never ends stops at the configured cap instead of filling the disk."""

from __future__ import annotations

import io

import pytest

from tensor_registry_server.artifacts.making.attempt import copy_stream
from tensor_registry_server.jobs.runner import JobFailure


class EndlessSource(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return b"\xab" * (n if n > 0 else 65536)


def test_an_endless_source_is_cut_off_at_the_cap() -> None:
    target = io.BytesIO()
    with pytest.raises(JobFailure) as caught:
        copy_stream(EndlessSource(), target, max_bytes=5 * 1024 * 1024)
    assert caught.value.code == "source_too_large"
    assert len(target.getvalue()) <= 5 * 1024 * 1024


def test_a_source_within_the_cap_is_copied_whole() -> None:
    data = b"x" * 1000
    target = io.BytesIO()
    assert copy_stream(io.BytesIO(data), target, max_bytes=1000)[0] == 1000
    assert target.getvalue() == data
