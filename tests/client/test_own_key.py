"""A node that brings its own key (`--keyfile`): `pull` and `load` of an encrypted artifact with
a token that has no `keys:read`, and the registry is never asked for the key (no key URL issued,
none audited, none fetched). And `load` chooses variants with the same flags as `pull`."""

from __future__ import annotations

import json
import shlex
import uuid
from pathlib import Path

import torch

from harness.artifacts import make_artifact
from tensor_registry.formats.model_signature import KEYFILE_PATH
from tests.client.conftest import Registry


def _name() -> str:
    return f"acme/own-{uuid.uuid4().hex[:10]}"


def _key_traffic(registry: Registry, since: int) -> list[str]:
    """Request lines of the key route since line ``since`` of the server's log."""
    return [
        line
        for line in list(registry.server.lines)[since:]
        if '"event": "request"' in line and "/api/v1/keys/" in line
    ]


def _key_issues(registry: Registry, artifact_id: str) -> list[dict[str, object]]:
    with registry.http() as http:
        items = http.get("/api/v1/audit", params={"action": "key.issue", "limit": 500}).json()
    return [e for e in items["items"] if e["target_id"] == artifact_id]


def _error(result: object) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


async def test_pull_with_the_nodes_own_key_needs_no_keys_read(
    registry: Registry, tmp_path: Path, cache_dir: Path
) -> None:
    name = _name()
    registry.ready_model(name)
    made = await make_artifact(registry.settings, model=name, version=1, encrypted=True)
    assert made.key is not None
    own = tmp_path / "secrets" / "llama.key"
    own.parent.mkdir()
    own.write_bytes(made.key)
    resolver = registry.token_with("resolve", "models:read", name="no-keys")
    dest = tmp_path / "llama"
    since = len(registry.server.lines)
    pulled = registry.cli(
        "pull", name, "--encrypted", "--keyfile", str(own), "--dest", str(dest),
        "--cache-dir", str(cache_dir), token=resolver,
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    assert "(this node's own)" in pulled.stderr
    # vLLM is pointed at the node's key; nothing was fetched or written in its place.
    extra = json.loads(shlex.split(pulled.stdout.strip())[6])
    assert extra["encryption_keyfile"] == str(own.resolve())
    assert not (dest / KEYFILE_PATH).exists() and not (dest / "tensorizer.key").exists()
    assert (dest / "config.json").exists()
    assert _key_traffic(registry, since) == []
    # Even a token that could read the key is not given a key URL when it brings its own.
    keyholder = registry.token_with("resolve", "keys:read", name="keys")
    again = registry.cli(
        "pull", name, "--keyfile", str(own), "--dest", str(tmp_path / "again"),
        "--cache-dir", str(cache_dir), token=keyholder,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert _key_issues(registry, str(made.id)) == []
    assert _key_traffic(registry, since) == []
    # Without --keyfile the same token still needs keys:read, and the error says what to do.
    refused = registry.cli(
        "pull", name, "--dest", str(tmp_path / "nokey"), "--cache-dir", str(cache_dir),
        token=resolver,
    )  # fmt: skip
    assert refused.returncode == 1 and "--keyfile" in _error(refused)


async def test_a_key_file_that_is_no_key_is_refused_before_anything_is_asked(
    registry: Registry, tmp_path: Path, cache_dir: Path
) -> None:
    name = _name()
    registry.ready_model(name)
    await make_artifact(registry.settings, model=name, version=1, encrypted=True)
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"x" * 31)
    since = len(registry.server.lines)
    refused = registry.cli(
        "pull", name, "--keyfile", str(bad), "--dest", str(tmp_path / "d"),
        "--cache-dir", str(cache_dir),
    )  # fmt: skip
    assert refused.returncode == 1
    assert "holds 31 bytes, not the 32" in _error(refused)
    assert not any("/api/v1/resolve" in line for line in list(registry.server.lines)[since:])
    missing = registry.cli("load", name, "--keyfile", str(tmp_path / "nope.key"))
    assert missing.returncode == 1 and "nope.key" in _error(missing)


async def test_load_takes_the_variant_flags_and_the_nodes_own_key(
    registry: Registry, tmp_path: Path
) -> None:
    state = {"w": torch.randn(64, 32), "b": torch.randn(32)}
    name = _name()
    registry.ready_model(name)
    made = await make_artifact(
        registry.settings, model=name, version=1, encrypted=True, sources=[state], layout=True
    )
    assert made.key is not None
    own = tmp_path / "own.key"
    own.write_bytes(made.key)
    resolver = registry.token_with("resolve", "models:read", name="no-keys")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    since = len(registry.server.lines)
    loaded = registry.cli(
        "load", name, "--encrypted", "--keyfile", str(own), "--json", token=resolver, env=env
    )
    assert loaded.returncode == 0, loaded.stderr
    result = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert result["path"] == "tensorizer" and result["tensors"] == 2, result
    assert _key_traffic(registry, since) == []
    # --no-encrypted chooses among plain artifacts only: there is none.
    plain = registry.cli("load", name, "--no-encrypted", token=resolver, env=env)
    assert plain.returncode == 1 and "no_matching_artifact" in plain.stderr
    # A wrong key is told apart from a missing scope.
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(bytes(32))
    failed = registry.cli("load", name, "--keyfile", str(wrong), token=resolver, env=env)
    assert failed.returncode == 1 and "does not decrypt with the key" in failed.stderr
