"""Every node-side entry point checks in (tensor_registry/checkins.py) against a real `serve`:
`load` and `pull` run as the real CLI, then GET /api/v1/nodes shows the node with what the
command did — path, seconds, GB/s, verified, artifact, ref — or why it failed; the agent,
`load` and `pull` of one node report one node id; a registry that drops check-ins costs a
warning line, never the load; the opt-out sends nothing."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from harness.artifacts import MadeArtifact, make_artifact
from harness.loopback import QuietHandler, serving
from harness.serve_process import free_port
from tensor_registry import RegistryClient, checkins
from tensor_registry.agent.agent import Agent
from tensor_registry.node_cache import NodeCache
from tests.client.conftest import Registry


async def _artifact(registry: Registry) -> tuple[str, MadeArtifact]:
    name = f"acme/ci-{uuid.uuid4().hex[:10]}"
    registry.ready_model(name)
    state = {"w": torch.randn(256, 64, generator=torch.Generator().manual_seed(3))}
    made = await make_artifact(
        registry.settings, model=name, version=1, sources=[state], layout=True
    )
    return name, made


def _node(registry: Registry, node_id: str) -> dict[str, Any] | None:
    with registry.http() as http:
        r = http.get("/api/v1/nodes", params={"include_stale": "true", "limit": 500})
        assert r.status_code == 200, r.text
        return next((n for n in r.json()["items"] if n["id"] == node_id), None)


async def test_load_checks_in_with_its_figures_and_its_failures(
    registry: Registry, tmp_path: Path
) -> None:
    name, made = await _artifact(registry)
    cache_dir = tmp_path / "cache"
    env = {"TENSOR_REGISTRY_CACHE_DIR": str(cache_dir)}
    done = registry.cli("load", f"{name}:1", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    line = json.loads(done.stdout.splitlines()[0])
    node_id = (cache_dir / "node-id").read_text().strip()  # made once, kept in the node cache
    node = _node(registry, node_id)
    assert node is not None and node["status"] == "live"
    assert node["hostname"] == socket.gethostname()[:255]
    [entry] = node["loaded"]
    assert entry["by"] == "load" and entry["model"] == name and entry["ref"] == "1"
    assert (entry["artifact_id"], entry["version"]) == (str(made.id), 1)
    assert (entry["path"], entry["verified"], entry["error"]) == ("engine", True, None)
    assert entry["seconds"] == round(line["seconds"], 4)
    assert entry["gbps"] == pytest.approx(line["bytes"] / line["seconds"] / 1e9, rel=1e-2)
    assert entry["gbps"] > 0

    missing = registry.cli("load", "acme/does-not-exist:prod", env=env)
    assert missing.returncode == 1 and "model_not_found" in missing.stderr
    node = _node(registry, node_id)
    assert node is not None
    failed = node["loaded"][0]
    assert (failed["model"], failed["ref"], failed["artifact_id"]) == (
        "acme/does-not-exist",
        "prod",
        None,
    )
    assert "model_not_found" in failed["error"] and failed["verified"] is False
    assert node["loaded"][1]["id"] == entry["id"]  # the earlier load is still listed


async def test_pull_agent_and_load_report_one_node_and_what_its_cache_holds(
    registry: Registry, tmp_path: Path
) -> None:
    name, made = await _artifact(registry)
    cache_dir = tmp_path / "cache"
    # An agent that kept its id in its state dir before: the node keeps that id.
    state_dir = tmp_path / "agent-state"
    state_dir.mkdir()
    (state_dir / "node-id").write_text("legacy-node-7\n")
    with RegistryClient(registry.url, registry.token) as client:
        agent = Agent(client, NodeCache(cache_dir), [], state_dir=state_dir)
    assert agent.node_id == "legacy-node-7"
    assert (cache_dir / "node-id").read_text().strip() == "legacy-node-7"

    dest = tmp_path / "serve-dir"
    pulled = registry.cli(
        "pull", f"{name}:1", "--dest", str(dest), "--weights", "--cache-dir", str(cache_dir)
    )
    assert pulled.returncode == 0, pulled.stderr
    node = _node(registry, "legacy-node-7")
    assert node is not None
    [entry] = node["loaded"]
    assert (entry["by"], entry["path"], entry["artifact_id"]) == ("pull", "pull", str(made.id))
    assert entry["verified"] is True and entry["seconds"] > 0 and entry["gbps"] > 0
    # The node cache holds the artifact whole: reported, and by the agent's check-ins too.
    assert node["cached"] == [str(made.id)]
    assert str(made.id) in agent.checkin_body()["cached"]

    # A load from the same cache is the same node; its entry joins the pull's.
    loaded = registry.cli(
        "load", f"{name}:1", "--json", env={"TENSOR_REGISTRY_CACHE_DIR": str(cache_dir)}
    )
    assert loaded.returncode == 0, loaded.stderr
    node = _node(registry, "legacy-node-7")
    assert node is not None
    assert [(x["by"], x["path"]) for x in node["loaded"]] == [("load", "engine"), ("pull", "pull")]
    assert json.loads(loaded.stdout.splitlines()[0])["source"] == "file"  # the pulled copy


async def test_the_opt_out_sends_nothing(registry: Registry, tmp_path: Path) -> None:
    name, _ = await _artifact(registry)
    node_id = f"opted-out-{uuid.uuid4().hex[:8]}"
    env = {"TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache"), "TENSOR_REGISTRY_NODE_ID": node_id}
    flag = registry.cli("load", name, "--no-checkin", env=env)
    assert flag.returncode == 0, flag.stderr
    by_env = registry.cli(
        "pull", name, "--dest", str(tmp_path / "d"), env={**env, "TENSOR_REGISTRY_NO_CHECKIN": "1"}
    )
    assert by_env.returncode == 0, by_env.stderr
    assert _node(registry, node_id) is None
    # The same command without the opt-out does report that node (the check above can fail).
    assert registry.cli("load", name, env=env).returncode == 0
    assert _node(registry, node_id) is not None


class _DropsCheckIns(QuietHandler):
    """A proxy in front of the registry that forwards every GET and drops check-ins: the
    connection closes without an answer."""

    upstream = ""

    def do_GET(self) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() == "authorization"}
        answer = httpx.get(self.upstream + self.path, headers=headers, timeout=30)
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def do_POST(self) -> None:
        self.close_connection = True  # no answer at all


async def test_a_registry_that_drops_check_ins_costs_a_warning_not_the_load(
    registry: Registry, tmp_path: Path
) -> None:
    name, _ = await _artifact(registry)
    _DropsCheckIns.upstream = registry.url
    with serving(_DropsCheckIns) as proxy:
        done = registry.cli(
            "load",
            name,
            "--json",
            env={"TENSOR_REGISTRY_URL": proxy, "TENSOR_REGISTRY_CACHE_DIR": str(tmp_path)},
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["verified"] is True
    [warning] = [x for x in done.stderr.splitlines() if x.startswith("warning:")]
    assert "check-in failed" in warning and "TENSOR_REGISTRY_NO_CHECKIN" in warning


def test_a_check_in_to_a_closed_port_returns_at_once_with_one_line(tmp_path: Path) -> None:
    lines: list[str] = []
    entry = checkins.load_entry(
        by="load", model="acme/x", ref="prod", path="engine", seconds=1.0, verified=True
    )
    with RegistryClient(f"http://127.0.0.1:{free_port()}", "trg_x") as client:
        started = time.monotonic()
        assert checkins.report(client, tmp_path, entry, say=lines.append) is False
    assert time.monotonic() - started < checkins.TIMEOUT_SECONDS * 3
    [line] = lines
    assert "check-in failed" in line and "trg_x" not in line


def test_a_registry_that_drips_its_answer_costs_the_timeout_in_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each byte arrives inside the per-step timeout, so only the check-in's total bound ends
    the wait: the caller goes on after TIMEOUT_SECONDS, told so in one line."""
    monkeypatch.setattr(checkins, "TIMEOUT_SECONDS", 0.6)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.2):  # a header line, one byte at a time, never finished
                conn.sendall(b"X")

    threading.Thread(target=drip, daemon=True).start()
    lines: list[str] = []
    entry = checkins.load_entry(
        by="load", model="acme/x", ref="prod", path="engine", seconds=1.0, verified=True
    )
    port = listener.getsockname()[1]
    try:
        with RegistryClient(f"http://127.0.0.1:{port}", "trg_x") as client:
            started = time.monotonic()
            assert checkins.report(client, tmp_path, entry, say=lines.append) is False
            took = time.monotonic() - started
    finally:
        stop.set()
        listener.close()
    assert took < 0.6 + 1.0, took
    [line] = lines
    assert "unanswered after 0.6 s" in line and "trg_x" not in line


def test_a_token_that_may_not_check_in_is_told_once(registry: Registry, tmp_path: Path) -> None:
    reader = registry.token_with("models:read", name="reader-only")
    lines: list[str] = []
    entry = checkins.load_entry(
        by="load", model="acme/x", ref="prod", path="engine", seconds=1.0, verified=True
    )
    checkins._scope_warned.clear()
    with RegistryClient(registry.url, reader) as client:
        for _ in range(2):
            assert checkins.report(client, tmp_path, entry, say=lines.append) is False
    [line] = lines
    assert "insufficient_scope" in line and "'resolve'" in line


def test_the_cache_reports_an_artifact_only_while_it_holds_all_its_files(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path)
    artifact = str(uuid.uuid4())
    files = {}
    for data in (b"config", b"weights" * 100):
        sha = hashlib.sha256(data).hexdigest()
        cache.path(sha).parent.mkdir(parents=True, exist_ok=True)
        cache.path(sha).write_bytes(data)
        files[sha] = len(data)
    cache.record_artifact(artifact, list(files.items()))
    assert cache.artifacts() == [artifact]
    pruned = next(iter(files))
    cache.path(pruned).unlink()  # what prune does to an object
    assert cache.artifacts() == []
    assert not (tmp_path / "artifacts" / artifact).exists()  # the record went with it
    with pytest.raises(ValueError):
        cache.record_artifact("../escape", list(files.items()))
    assert not (tmp_path / "escape").exists()
