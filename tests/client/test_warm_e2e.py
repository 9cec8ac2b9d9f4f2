"""Warm state end to end on CPU: real `tensor-registry serve` with its real worker process, a
stand-in vLLM with vLLM 0.24's compile-cache layout and hash (harness/vllm_standin.py), the
real CLI. The warm job serves once and publishes a signed bundle; a node restores it, starts
(stand-in) vLLM, which loads instead of compiling, and reports a hit; a node with other serve
arguments is told before start and reports a miss naming the argument; a node that restored
the bundle but started vLLM with other arguments reports a miss naming vLLM's config hash.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.artifacts import make_artifact
from harness.serve_process import ServeProcess, free_port
from harness.vllm_standin import write_standin
from tensor_registry_server.settings import Settings
from tests.client.conftest import TOKEN, Registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_standin(
        tmp_path_factory.mktemp("standin"), serializing=False, serving=True, distribution=True
    )


@pytest.fixture(scope="module")
def warm_registry(
    tmp_path_factory: pytest.TempPathFactory, standin: Path
) -> Iterator[tuple[Registry, Path]]:
    data_dir = tmp_path_factory.mktemp("warm-serve") / "data"
    models = tmp_path_factory.mktemp("warm-models")
    server = ServeProcess(
        data_dir=data_dir,
        port=free_port(),
        worker=True,
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN,
            "TENSOR_REGISTRY_WORKER__HEARTBEAT_SECONDS": "1",
            "TENSOR_REGISTRY_WORKER__WARM_MODEL_ROOT": str(models),
            "PYTHONPATH": os.pathsep.join([str(standin), str(ROOT)]),
            "STANDIN_COMPILE_SECONDS": "0.2",
        },
    ).start()
    try:
        settings = Settings(
            data_dir=data_dir,
            database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
            storage={},  # type: ignore[arg-type]
            security={},  # type: ignore[arg-type]
        )
        config_home = tmp_path_factory.mktemp("xdg-config-warm")
        yield (
            Registry(server=server, token=TOKEN, settings=settings, config_home=config_home),
            models,
        )
    finally:
        server.stop()


def _until(what: str, check: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _cli(registry: Registry, standin: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on a node whose vLLM is the stand-in (its versions enter the key)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(standin), str(ROOT)]),
        TENSOR_REGISTRY_URL=registry.server.url,
        TENSOR_REGISTRY_TOKEN=registry.token,
        XDG_CONFIG_HOME=str(registry.config_home),
    )
    return subprocess.run(
        [sys.executable, "-m", "tensor_registry.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=ROOT,
    )


def _vllm_serve(
    standin: Path, model: str, cache_root: Path, log: Path, record: Path, *serve_args: str
) -> dict[str, Any]:
    """Start the stand-in `vllm serve` as a node would, wait for /health, stop it."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(standin),
        "VLLM_CACHE_ROOT": str(cache_root),
        "STANDIN_SERVE_RECORD": str(record),
        "STANDIN_COMPILE_SECONDS": "0.2",
    }
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--port", str(port)]
    cmd += ["--host", "127.0.0.1", "--dtype", "float32", "--tensor-parallel-size", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, *serve_args], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _until("stand-in vLLM to serve", healthy, timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return dict(json.loads(record.read_text()))


def test_warm_job_restore_hit_and_named_misses(
    warm_registry: tuple[Registry, Path], standin: Path, tmp_path: Path
) -> None:
    registry, models = warm_registry
    name = "acme/warm-e2e"
    model = registry.ready_model(name)
    made = asyncio.run(make_artifact(registry.settings, model=name, version=1, format="vllm"))
    with registry.http() as http:

        def vllm_worker() -> bool:
            workers = http.get("/api/v1/workers").json()["items"]
            return any((w["capabilities"].get("versions") or {}).get("vllm") for w in workers)

        _until("a worker advertising vLLM", vllm_worker, timeout=600)
        body = {"dtype": "float32", "format": "vllm", "serve_args": ["--max-model-len=512"]}
        started = http.post(f"/api/v1/models/{model['id']}/warm", json=body)
        assert started.status_code == 202, started.text
        job_id = started.json()["id"]
        job = _until(
            f"the warm job to end: {http.get(f'/api/v1/jobs/{job_id}').text} "
            + "\n".join(
                [x for x in registry.server.lines if "tensor_registry.access" not in x][-30:]
            ),
            lambda: (
                (j := http.get(f"/api/v1/jobs/{job_id}").json())["status"]
                in ("succeeded", "failed", "cancelled")
                and j
            ),
            # A loaded 2-core machine: the worker's first job waits for its warm-up (torch).
            timeout=900,
        )
        assert job["status"] == "succeeded", job
        [bundle] = http.get(f"/api/v1/models/{model['id']}/warm-bundles").json()["items"]
        assert bundle["status"] == "ready" and bundle["artifact_id"] == str(made.id)
        model_path = bundle["key"]["model"]
        assert model_path == str(models / str(made.id))
        assert bundle["key"]["serve_args"] == ["--max-model-len=512"]
        [hash_dir] = bundle["cache"]["dirs"]
        assert bundle["cache"]["logged"] == [hash_dir]
        assert http.post(f"/api/v1/models/{model['id']}/warm", json=body).status_code == 200

    # A node with the same arguments: restored, vLLM loads it (no compile), a hit checked in.
    node = tmp_path / "node-a"
    restored = _cli(
        registry,
        standin,
        "warm-restore",
        f"{name}:1",
        "--model-path",
        model_path,
        "--serve-arg=--max-model-len=512",
        "--cache-root",
        str(node),
    )
    assert restored.returncode == 0, restored.stderr
    expect = json.loads(restored.stdout)
    assert (expect["expect"], expect["dirs"]) == ("hit", [hash_dir]), expect
    ran = _vllm_serve(
        standin, model_path, node, tmp_path / "a.log", tmp_path / "a.json", "--max-model-len=512"
    )
    assert ran == {"hash": hash_dir.rsplit("/", 1)[1], "compiled": False}
    report = _cli(
        registry,
        standin,
        "warm-report",
        "--cache-root",
        str(node),
        "--log",
        str(tmp_path / "a.log"),
        "--model",
        name,
        "--cache-dir",
        str(tmp_path / "nc-a"),
    )
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["result"] == "hit"

    # Other serve arguments: not restored, vLLM compiles, the miss names the argument.
    other = tmp_path / "node-b"
    told = _cli(
        registry,
        standin,
        "warm-restore",
        f"{name}:1",
        "--model-path",
        model_path,
        "--serve-arg=--max-model-len=1024",
        "--cache-root",
        str(other),
    )
    assert told.returncode == 0, told.stderr
    assert json.loads(told.stdout)["expect"] == "miss"
    ran = _vllm_serve(
        standin, model_path, other, tmp_path / "b.log", tmp_path / "b.json", "--max-model-len=1024"
    )
    assert ran["compiled"] is True
    missed = _cli(
        registry,
        standin,
        "warm-report",
        "--cache-root",
        str(other),
        "--log",
        str(tmp_path / "b.log"),
        "--model",
        name,
        "--cache-dir",
        str(tmp_path / "nc-b"),
    )
    outcome = json.loads(missed.stdout)
    assert outcome["result"] == "miss"
    assert any("--max-model-len" in d for d in outcome["differed"]), outcome
    assert "MISS" in missed.stderr

    # Restored for 512, but vLLM started with 1024: vLLM's own config hash names the miss.
    third = tmp_path / "node-c"
    assert (
        _cli(
            registry,
            standin,
            "warm-restore",
            f"{name}:1",
            "--model-path",
            model_path,
            "--serve-arg=--max-model-len=512",
            "--cache-root",
            str(third),
        ).returncode
        == 0
    )
    _vllm_serve(
        standin, model_path, third, tmp_path / "c.log", tmp_path / "c.json", "--max-model-len=1024"
    )
    late = json.loads(
        _cli(
            registry,
            standin,
            "warm-report",
            "--cache-root",
            str(third),
            "--log",
            str(tmp_path / "c.log"),
            "--model",
            name,
            "--cache-dir",
            str(tmp_path / "nc-c"),
        ).stdout
    )
    assert late["result"] == "miss"
    assert any("config_hash" in d for d in late["differed"]), late

    # The registry saw both outcomes in the nodes' check-ins.
    with registry.http() as http:
        nodes = http.get("/api/v1/nodes").json()["items"]
    results = sorted(
        entry["warm"]["result"] for n in nodes for entry in n["loaded"] if entry.get("warm")
    )
    assert results == ["hit", "miss", "miss"]
