"""Key rotation through real `serve` restarts on one URL: artifacts signed before a rotation
still verify, new ones are signed with the new key, a client that pinned the old key accepts
the new one because the registry publishes it endorsed by the old one, and a swapped key
(no endorsement) is refused."""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.serve_process import ServeProcess, free_port
from tensor_registry import RegistryClient
from tensor_registry.engine import load_artifact
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import TrustError
from tensor_registry_server.settings import Settings
from tensor_registry_server.trust.signing_keys import manifest_keys, public_key_b64
from tests.client.conftest import TOKEN, Registry


def _seed() -> str:
    return base64.b64encode(os.urandom(32)).decode()


@contextmanager
def _serving(
    data_dir: Path,
    port: int,
    security: dict[str, object],
    *,
    worker: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[Registry]:
    env = {
        **(env or {}),
        "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
        "TENSOR_REGISTRY_SECURITY__MANIFEST_SIGNING_KEY": str(security["manifest_signing_key"]),
        "TENSOR_REGISTRY_SECURITY__MANIFEST_PREVIOUS_KEYS": json.dumps(
            security.get("manifest_previous_keys", [])
        ),
        "TENSOR_REGISTRY_SECURITY__MANIFEST_RETIRED_PUBLIC_KEYS": json.dumps(
            security.get("manifest_retired_public_keys", [])
        ),
    }
    server = ServeProcess(data_dir=data_dir, port=port, env=env, worker=worker).start()
    settings = Settings(
        data_dir=data_dir,
        database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
        storage={},  # type: ignore[arg-type]
        security=security,  # type: ignore[arg-type]
    )
    try:
        yield Registry(
            server=server, token=TOKEN, settings=settings, config_home=data_dir.parent / "xdg"
        )
    finally:
        server.stop()


def _load(registry: Registry, name: str, cache: Path, **kwargs: object) -> str | None:
    with RegistryClient(registry.url, TOKEN) as client:
        result = load_artifact(name, client=client, cache=NodeCache(cache), **kwargs)  # type: ignore[arg-type]
    assert result.tensors["a.weight"].shape == (300, 257)
    return result.signed_by


async def test_rotation_keeps_old_artifacts_verifiable_and_signs_new_ones_with_the_new_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.client.test_trust import signed_artifact

    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(tmp_path / "client-config"))
    monkeypatch.delenv("TENSOR_REGISTRY_TRUSTED_KEYS", raising=False)
    data_dir, port, cache = tmp_path / "data", free_port(), tmp_path / "cache"
    old, new, swapped = _seed(), _seed(), _seed()
    old_id = manifest_keys(Settings(security={"manifest_signing_key": old})).active_id  # type: ignore[arg-type]
    new_id = manifest_keys(Settings(security={"manifest_signing_key": new})).active_id  # type: ignore[arg-type]
    name_old, name_new, name_swapped = (f"acme/r-{uuid.uuid4().hex[:8]}" for _ in range(3))

    with _serving(data_dir, port, {"manifest_signing_key": old}) as registry:
        await signed_artifact(registry, name=name_old, seed=1)
        assert _load(registry, name_old, cache) == old_id  # pins the old key

    rotated = {"manifest_signing_key": new, "manifest_previous_keys": [old]}
    with _serving(data_dir, port, rotated) as registry:
        await signed_artifact(registry, name=name_new, seed=2)
        assert _load(registry, name_old, cache) == old_id
        assert _load(registry, name_new, cache) == new_id  # endorsed by the pinned old key
        pins = json.loads((tmp_path / "client-config" / "trusted-keys.json").read_text())
        assert set(pins["registries"][manifest_keys(registry.settings).registry_id]["keys"]) == {
            old_id,
            new_id,
        }
        # Keys configured explicitly are all that is trusted: no endorsement widens them.
        monkeypatch.setenv("TENSOR_REGISTRY_TRUSTED_KEYS", public_key_b64(old))
        with pytest.raises(TrustError) as caught:
            _load(registry, name_new, cache)
        assert caught.value.code == "untrusted_signing_key"
        # By number: the manifest binds it. (`latest` or an alias needs the signed binding,
        # which the active key signs: a node configured with the old key only refuses it.)
        assert _load(registry, f"{name_old}:1", cache) == old_id
        with pytest.raises(TrustError) as caught:
            _load(registry, name_old, cache)
        assert caught.value.code == "untrusted_signing_key"
        monkeypatch.delenv("TENSOR_REGISTRY_TRUSTED_KEYS")

    # A registry whose key was swapped without the old one to endorse it is not believed.
    with _serving(data_dir, port, {"manifest_signing_key": swapped}) as registry:
        await signed_artifact(registry, name=name_swapped, seed=3)
        with pytest.raises(TrustError) as caught:
            _load(registry, name_swapped, cache)
        assert caught.value.code == "untrusted_signing_key"
        # What was signed before is still checked against the pins and loads, by number: the
        # swapped key also signs the answer's binding, so `latest` is refused as well.
        assert _load(registry, f"{name_new}:1", cache) == new_id
        with pytest.raises(TrustError) as caught:
            _load(registry, name_new, cache)
        assert caught.value.code == "untrusted_signing_key"


async def test_a_key_the_registry_retires_stops_being_trusted_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 §2: once the registry publishes the old key as retired (in its keys document,
    signed by the current key), a node that pinned it refuses what only that key signed, also
    after the registry lists it as a previous key again (a replayed or rolled-back config)."""
    from tests.client.test_trust import signed_artifact

    config = tmp_path / "client-config"
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(config))
    monkeypatch.delenv("TENSOR_REGISTRY_TRUSTED_KEYS", raising=False)
    data_dir, port, cache = tmp_path / "data", free_port(), tmp_path / "cache"
    old, new = _seed(), _seed()
    old_id = manifest_keys(Settings(security={"manifest_signing_key": old})).active_id  # type: ignore[arg-type]
    name_old, name_new = (f"acme/retire-{uuid.uuid4().hex[:8]}" for _ in range(2))

    with _serving(data_dir, port, {"manifest_signing_key": old}) as registry:
        await signed_artifact(registry, name=name_old, seed=1)
        assert _load(registry, f"{name_old}:1", cache) == old_id
    rotated = {"manifest_signing_key": new, "manifest_previous_keys": [old]}
    with _serving(data_dir, port, rotated) as registry:
        await signed_artifact(registry, name=name_new, seed=2)
        assert _load(registry, f"{name_old}:1", cache) == old_id
    retired = {"manifest_signing_key": new, "manifest_retired_public_keys": [public_key_b64(old)]}
    with _serving(data_dir, port, retired) as registry:
        ident = manifest_keys(registry.settings).registry_id
        with pytest.raises(TrustError) as caught:
            _load(registry, f"{name_old}:1", cache)
        assert caught.value.code == "untrusted_signing_key"
        assert _load(registry, f"{name_new}:1", cache) != old_id
        pins = json.loads((config / "trusted-keys.json").read_text())["registries"][ident]
        assert old_id not in pins["keys"] and pins["revoked"] == [old_id]
    with _serving(data_dir, port, rotated) as registry:  # the old key listed again
        with pytest.raises(TrustError) as caught:
            _load(registry, f"{name_old}:1", cache)
        assert caught.value.code == "untrusted_signing_key"
