"""What a real `serve` leaves on disk is private, and its keys live apart from everything it serves.

- every directory under data_dir is 0700 and every file 0600: the SQLite database and its WAL and
  SHM, the storage tree, the embedded broker's messages, the secrets;
- the signing key and the master key are separate files in data_dir/secrets, outside storage;
- a data dir of an earlier release (one secrets.json) keeps its keys across the upgrade;
- a storage or import root that would contain the secrets refuses to start.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx

from harness.hf_bytes import tiny_safetensors
from harness.serve_process import ROOT, ServeProcess, free_port
from harness.waiting import wait_live_worker_sync
from tensor_registry_server.settings import Settings, _local_secret
from tests.test_serve import TOKEN_RE


def _loose_modes(data_dir: Path) -> list[str]:
    """Everything under data_dir that anyone but the owner could read, write or enter."""
    found = []
    for path in [data_dir, *data_dir.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        if stat.S_IMODE(mode) & 0o077:
            found.append(f"{path.relative_to(data_dir.parent)} {oct(stat.S_IMODE(mode))}")
    return found


def test_a_real_serve_creates_only_owner_private_files(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir=data_dir, port=free_port(), worker=True).start()
    try:
        token = next(m.group(0) for line in server.lines if (m := TOKEN_RE.search(line)))
        h = {"Authorization": f"Bearer {token}"}
        model = httpx.post(f"{server.url}/api/v1/models", json={"name": "acme/p"}, headers=h)
        assert model.status_code == 201, model.text
        base = f"{server.url}/api/v1/models/{model.json()['id']}/versions"
        assert httpx.post(base, json={}, headers=h).status_code == 201
        r = httpx.put(f"{base}/1/files/model.safetensors", content=tiny_safetensors(), headers=h)
        assert r.status_code == 201, r.text
        # The embedded worker is up once it is listed: the broker dir exists by then.
        with httpx.Client(base_url=server.url, headers=h) as api:
            wait_live_worker_sync(api, detail=lambda: "".join(server.lines))
        names = {p.name for p in data_dir.rglob("*")}
        # (The WAL and SHM files exist while a connection is open; SQLite gives them the
        # database file's mode, checked below with everything else that exists.)
        assert "registry.db" in names, sorted(names)
        assert (data_dir / "broker").is_dir() and (data_dir / "storage").is_dir()
        assert any(p.is_file() for p in (data_dir / "storage").rglob("*"))
        assert not (data_dir / "secrets.json").exists()
        signing = (data_dir / "secrets" / "signing.key").read_text()
        master = (data_dir / "secrets" / "master.key").read_text()
        assert len(signing) >= 32 and len(master) >= 32 and signing != master
        assert _loose_modes(data_dir) == []
    finally:
        server.stop()


def test_keys_of_an_earlier_release_are_moved_and_kept(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    legacy = {"signing_key": "old-signing-" + "s" * 40, "master_key": "old-master-" + "m" * 40}
    (data_dir / "secrets.json").write_text(json.dumps(legacy))
    os.chmod(data_dir, 0o755)  # noqa: S103 - the mode of an earlier release, tightened on start
    server = ServeProcess(data_dir=data_dir, port=free_port()).start()
    try:
        assert (data_dir / "secrets" / "signing.key").read_text() == legacy["signing_key"]
        assert (data_dir / "secrets" / "master.key").read_text() == legacy["master_key"]
        assert not (data_dir / "secrets.json").exists()
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((data_dir / "secrets").stat().st_mode) == 0o700
    finally:
        server.stop()
    # The same process-level answer without a server: settings read the moved files.
    _local_secret.cache_clear()
    settings = Settings(data_dir=data_dir)
    assert settings.signing_key_bytes() == legacy["signing_key"].encode()
    assert settings.master_key_bytes() == legacy["master_key"].encode()


def test_a_storage_or_import_root_holding_the_secrets_refuses_to_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    cases = {
        "TENSOR_REGISTRY_STORAGE__LOCAL_ROOT": str(data_dir),
        "TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS": json.dumps([str(tmp_path)]),
    }
    for name, value in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "tensor_registry.cli", "migrate", "--data-dir", str(data_dir)],
            cwd=ROOT,
            env={**clean, name: value},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0, (name, done.stdout)
        assert "refusing to start" in done.stderr and "secrets" in done.stderr, done.stderr
        assert not (data_dir / "registry.db").exists()
