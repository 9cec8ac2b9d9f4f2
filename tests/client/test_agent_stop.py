"""What `alias set --wait-warm` is told by the fleet, against a real `serve` and a real agent
process (issue 33 §2, §7.4): an agent that stops says so, and is no longer counted at once
(not after nodes.stale_after_seconds); with no watching node --wait-warm fails instead of
reporting success; and nodes that no artifact of the new version matches are named, with
why, instead of waited for until the timeout."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from harness.artifacts import make_artifact, rank_state
from harness.serve_process import ROOT
from harness.waiting import poll
from tests.client.conftest import Registry


class _Agent:
    """`tensor-registry agent` as a subprocess, its output in a file."""

    def __init__(self, registry: Registry, cache_dir: Path, watch: str) -> None:
        cache_dir.mkdir(parents=True)
        self.log = cache_dir.parent / f"agent-{uuid.uuid4().hex[:6]}.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "tensor_registry.cli", "agent"),
                *("--cache-dir", str(cache_dir), "--watch", watch),
            ],
            cwd=ROOT,
            env=registry.cli_env(),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._out.close()


def _model(registry: Registry, versions: int, with_artifact: int) -> tuple[str, str]:
    """A model with ``versions`` ready versions, an artifact for version ``with_artifact``
    only, and ``prod`` on that version: (name, model id)."""
    name = f"fleet/stop-{uuid.uuid4().hex[:8]}"
    model = registry.ready_model(name, versions=versions)
    asyncio.run(
        make_artifact(
            registry.settings,
            model=name,
            version=with_artifact,
            sources=[rank_state(7, elements=16 * 1024)],
        )
    )
    with registry.http() as http:
        r = http.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": with_artifact})
        assert r.status_code in (200, 201), r.text
    return name, str(model["id"])


def _rollout(registry: Registry, model_id: str) -> dict[str, Any]:
    with registry.http() as http:
        r = http.get(f"/api/v1/models/{model_id}/aliases/prod/rollout")
        assert r.status_code == 200, r.text
        return dict(r.json())


def _node(registry: Registry, node_id: str) -> dict[str, Any]:
    with registry.http() as http:
        items = http.get("/api/v1/nodes", params={"include_stale": "true", "limit": 500}).json()
    return next(n for n in items["items"] if n["id"] == node_id)


def test_a_stopped_agent_is_not_waited_for(registry: Registry, tmp_path: Path) -> None:
    name, model_id = _model(registry, versions=1, with_artifact=1)
    cache_dir = tmp_path / "cache"
    agent = _Agent(registry, cache_dir, f"{name}:prod")
    try:
        poll(
            lambda: len(_rollout(registry, model_id)["warm"]) == 1,
            what="the agent to be warm on version 1",
            timeout=90,
            detail=agent.output,
        )
    finally:
        code = agent.stop()
    assert code == 0, agent.output()
    # Right after it exits (well within nodes.stale_after_seconds, 180 s by default).
    rollout = _rollout(registry, model_id)
    assert rollout["watching"] == 0, rollout
    node_id = (cache_dir / "node-id").read_text().strip()
    assert _node(registry, node_id)["status"] == "stopped"
    assert "told the registry this agent stopped" in agent.output()

    # Nobody watches now: --wait-warm does not report success.
    done = registry.cli("alias", "set", name, "prod", "1", "--wait-warm", "90%")
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"no live node watches {name}:prod" in done.stderr
    assert "not reporting success" in done.stderr


def test_wait_warm_names_the_nodes_that_cannot_become_warm(
    registry: Registry, tmp_path: Path
) -> None:
    name, model_id = _model(registry, versions=2, with_artifact=1)
    agent = _Agent(registry, tmp_path / "cache", f"{name}:prod")
    try:
        poll(
            lambda: len(_rollout(registry, model_id)["warm"]) == 1,
            what="the agent to be warm on version 1",
            timeout=90,
            detail=agent.output,
        )
        node_id = (tmp_path / "cache" / "node-id").read_text().strip()
        # Version 2 has no artifact: the agent cannot pre-pull it, ever. The wait says so at
        # once instead of waiting out its timeout.
        started = time.monotonic()
        done = registry.cli(
            "alias", "set", name, "prod", "2", "--wait-warm", "100%", "--wait-timeout", "300"
        )
        took = time.monotonic() - started
    finally:
        agent.stop()
    assert done.returncode != 0, done.stdout + done.stderr
    assert took < 120, f"--wait-warm waited {took:.0f} s"
    assert "cannot become warm on version 2" in done.stderr, done.stderr
    assert node_id in done.stderr and "Nothing to resolve" in done.stderr, done.stderr
