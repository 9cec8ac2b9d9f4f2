"""A real `tensor-registry serve` for the client: started once per session, stopped at the end.

    registry.url / registry.token          where and how to call it
    registry.settings                      Settings over the same data dir (database, storage,
                                           secrets), for making artifacts directly
    registry.cli("resolve", "acme/x")      the CLI as a subprocess (TENSOR_REGISTRY_URL/TOKEN set)
    registry.blob_requests()               signed downloads the server has logged so far

Reusable by any suite: ``from tests.client.conftest import registry`` or via this folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.hf_bytes import tiny_safetensors
from harness.serve_process import ROOT, ServeProcess, free_port
from tensor_registry_server.settings import Settings

TOKEN = "trg_client-tests-admin-0123456789abcdefghijklmnopq"


@dataclass
class Registry:
    server: ServeProcess
    token: str
    settings: Settings
    config_home: Path

    @property
    def url(self) -> str:
        return self.server.url

    def http(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=30,
        )

    def cli(
        self,
        *args: str,
        token: str | None = None,
        env: dict[str, str | None] | None = None,
        timeout: float = 120,
        input: str | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The CLI as a subprocess; ``env`` values of None unset a variable."""
        return subprocess.run(
            [sys.executable, "-m", "tensor_registry.cli", *args],
            cwd=cwd or ROOT,
            env=self.cli_env(token=token, env=env),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )

    def cli_env(
        self, *, token: str | None = None, env: dict[str, str | None] | None = None
    ) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
        merged: dict[str, str | None] = {
            **clean,
            "PYTHONPATH": str(ROOT),
            # Never the developer's own `login` file.
            "XDG_CONFIG_HOME": str(self.config_home),
            "TENSOR_REGISTRY_URL": self.url,
            "TENSOR_REGISTRY_TOKEN": token or self.token,
            **(env or {}),
        }
        return {k: v for k, v in merged.items() if v is not None}

    def blob_requests(self) -> list[dict[str, Any]]:
        lines = []
        for line in list(self.server.lines):
            if '"event": "request"' in line and "/api/v1/blobs/" in line:
                lines.append(json.loads(line))
        return lines

    def token_with(self, *scopes: str, name: str = "t") -> str:
        with self.http() as http:
            r = http.post("/api/v1/tokens", json={"name": name, "scopes": list(scopes)})
            assert r.status_code == 201, r.text
            return str(r.json()["token"])

    def ready_model(self, name: str, versions: int = 1) -> dict[str, Any]:
        """A model with ``versions`` finalized versions (config + a tiny safetensors file)."""
        with self.http() as http:
            r = http.post("/api/v1/models", json={"name": name})
            assert r.status_code == 201, r.text
            model = dict(r.json())
            for _ in range(versions):
                number = http.post(f"/api/v1/models/{model['id']}/versions", json={}).json()[
                    "version"
                ]
                for path, data in (
                    (
                        "config.json",
                        b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}',
                    ),
                    ("model.safetensors", tiny_safetensors()),
                ):
                    up = http.put(
                        f"/api/v1/models/{model['id']}/versions/{number}/files/{path}",
                        content=data,
                        headers={"Content-Type": "application/octet-stream"},
                    )
                    assert up.status_code == 201, up.text
                done = http.post(f"/api/v1/models/{model['id']}/versions/{number}/finalize")
                assert done.status_code == 200, done.text
            return model


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with serving_registry(tmp_path_factory, {"TENSOR_REGISTRY_LOG_LEVEL": "INFO"}) as registry:
        yield registry


@contextmanager
def serving_registry(
    tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]
) -> Iterator[Registry]:
    """A real `serve` with the admin token and ``env``, and the settings of its data dir."""
    data_dir = tmp_path_factory.mktemp("serve") / "data"
    server = ServeProcess(
        data_dir=data_dir, port=free_port(), env={"TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN, **env}
    ).start()
    try:
        # Explicit values: this process's own TENSOR_REGISTRY_* variables must not point the
        # settings anywhere else than the server's data dir (database, storage, secrets.json).
        settings = Settings(
            data_dir=data_dir,
            database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
            storage={},  # type: ignore[arg-type]
            security={},  # type: ignore[arg-type]
        )
        config_home = tmp_path_factory.mktemp("xdg-config")
        yield Registry(server=server, token=TOKEN, settings=settings, config_home=config_home)
    finally:
        server.stop()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "node-cache"
