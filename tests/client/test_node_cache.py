"""The node cache against a real server: parallel ranged reads, sha256 checks, expired URLs."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest
import torch

from harness.artifacts import make_artifact
from tensor_registry import NodeCache, RegistryClient
from tensor_registry.api.client import ChecksumMismatch, SignatureExpired
from tensor_registry_server.storage import signing
from tests.client.conftest import Registry


async def _weights(registry: Registry) -> tuple[str, bytes, dict[str, object]]:
    name = f"acme/cache-{uuid.uuid4().hex[:8]}"
    registry.ready_model(name)
    made = await make_artifact(
        registry.settings, model=name, version=1, sources=[{"w": torch.randn(768, 1024)}]
    )
    with RegistryClient(registry.url, registry.token) as client:
        entry = next(f for f in client.resolve(name).files if f.is_weights)
    data = made.files["model.tensors"]
    return entry.url, data, {"sha256": entry.sha256, "size": entry.size, "id": made.id}


async def test_parallel_ranged_reads_land_the_exact_bytes(
    registry: Registry, tmp_path: Path
) -> None:
    url, data, meta = await _weights(registry)
    cache = NodeCache(tmp_path / "cache", parallel_min_bytes=1)
    before = len(registry.blob_requests())
    path, downloaded = cache.fetch(url, sha256=str(meta["sha256"]), size=len(data), readers=4)
    assert downloaded and path.read_bytes() == data
    assert path.stat().st_mode & 0o777 == 0o444
    requests = registry.blob_requests()[before:]
    assert len(requests) == 4 and {r["status"] for r in requests} == {206}
    assert cache.contains(str(meta["sha256"]), len(data))
    _, again = cache.fetch(url, sha256=str(meta["sha256"]), size=len(data), readers=4)
    assert not again and len(registry.blob_requests()) == before + 4

    dest = tmp_path / "dest" / "model.tensors"
    cache.place(str(meta["sha256"]), dest)
    assert dest.read_bytes() == data and dest.stat().st_ino == path.stat().st_ino


async def test_wrong_bytes_and_expired_urls_leave_nothing_behind(
    registry: Registry, tmp_path: Path
) -> None:
    url, data, meta = await _weights(registry)
    cache = NodeCache(tmp_path / "cache", parallel_min_bytes=1)
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ChecksumMismatch):
        cache.fetch(url, sha256=wrong, size=len(data), readers=3)
    assert not cache.contains(wrong, len(data))
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []

    expired = signing.blob_url(
        registry.url,
        registry.settings.signing_key_bytes(),
        storage="local",
        key=f"artifacts/{meta['id']}/model.tensors",
        ttl=-1,
    )
    for readers in (1, 3):
        with pytest.raises(SignatureExpired):
            cache.fetch(expired, sha256=str(meta["sha256"]), size=len(data), readers=readers)
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
    assert cache.size() == 0
