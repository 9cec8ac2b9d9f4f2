"""`tensor-registry agent` as a subprocess against a real `serve`: it pre-pulls each move of a
watched alias into the node cache (verified bytes), comes back after the registry restarts
without missing a move, sleeps without CPU while nothing happens, shares one download with
another agent on the same node, and keeps the cache within its budget without evicting what
a watch is warm on."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.artifacts import MadeArtifact, make_artifact, rank_state
from harness.loopback import QuietHandler, serving
from harness.serve_process import ROOT, ServeProcess, cpu_ticks, free_port
from harness.waiting import poll
from tensor_registry.agent.agent import Agent, Watch, _short
from tensor_registry.node_cache import NodeCache
from tensor_registry_server.settings import Settings
from tests.client.conftest import TOKEN, Registry


def _name() -> str:
    return f"fleet/agent-{uuid.uuid4().hex[:8]}"


def _artifacts(
    registry: Registry, name: str, versions: int, *, seed: int = 100
) -> list[MadeArtifact]:
    """A model with ``versions`` versions, each with a ready artifact of different bytes."""
    registry.ready_model(name, versions=versions)
    return [
        asyncio.run(
            make_artifact(
                registry.settings,
                model=name,
                version=v,
                sources=[rank_state(seed + v, elements=64 * 1024)],
            )
        )
        for v in range(1, versions + 1)
    ]


def _move(registry: Registry, name: str, version: int) -> None:
    with registry.http() as http:
        model = http.get("/api/v1/models", params={"name": name}).json()["items"][0]
        r = http.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": version})
        assert r.status_code in (200, 201), r.text


class AgentProcess:
    def __init__(self, registry: Registry, cache_dir: Path, *extra: str) -> None:
        self.log = cache_dir.parent / f"agent-{uuid.uuid4().hex[:6]}.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensor_registry.cli",
                "agent",
                "--cache-dir",
                str(cache_dir),
                *extra,
            ],
            cwd=ROOT,
            env=registry.cli_env(),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def output(self) -> str:
        return self.log.read_text()

    def cpu_ticks(self) -> int:
        return cpu_ticks(self.proc.pid)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._out.close()
        return code


def _holds(cache: NodeCache, made: MadeArtifact) -> bool:
    return all(cache.contains(made.sha256(p), len(d)) for p, d in made.files.items())


def _wait_warm(
    cache: NodeCache, made: MadeArtifact, agent: AgentProcess, timeout: float = 90
) -> None:
    poll(
        lambda: _holds(cache, made),
        what=f"the cache to hold version {made.version}'s files",
        timeout=timeout,
        detail=agent.output,
    )


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[Registry]:
    """A registry of this test's own, so that the test may restart it."""
    data_dir = tmp_path / "serve"
    server = ServeProcess(
        data_dir=data_dir,
        port=free_port(),
        env={"TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN, "TENSOR_REGISTRY_LOG_LEVEL": "INFO"},
    ).start()
    try:
        settings = Settings(
            data_dir=data_dir,
            database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
            storage={},  # type: ignore[arg-type]
            security={},  # type: ignore[arg-type]
        )
        config_home = tmp_path / "xdg"
        config_home.mkdir()
        yield Registry(server=server, token=TOKEN, settings=settings, config_home=config_home)
    finally:
        server.stop()


def test_agent_prepulls_moves_and_survives_a_registry_restart(
    own_registry: Registry, tmp_path: Path
) -> None:
    registry = own_registry
    name = _name()
    made = _artifacts(registry, name, 3)
    _move(registry, name, 1)
    cache_dir, state_dir = tmp_path / "cache", tmp_path / "state"
    agent = AgentProcess(
        registry, cache_dir, "--watch", f"{name}:prod", "--state-dir", str(state_dir)
    )
    cache = NodeCache(cache_dir)
    try:
        _wait_warm(cache, made[0], agent)  # the catch-up at start
        assert not _holds(cache, made[1])
        _move(registry, name, 2)
        _wait_warm(cache, made[1], agent)  # pushed by alias.moved

        # Idle: blocked in a read of the stream, no CPU (keep-alives every 15 s cost ~nothing).
        before = agent.cpu_ticks()
        window = time.monotonic()
        poll(lambda: time.monotonic() - window >= 3, what="an idle window", interval=0.5)
        assert agent.cpu_ticks() - before <= 2, "the agent used CPU while idle"

        # The registry restarts; a move after it reaches the agent, which reconnects by itself.
        registry.server.stop()
        registry.server.start()
        _move(registry, name, 3)
        _wait_warm(cache, made[2], agent, timeout=120)
        state = json.loads((state_dir / "state.json").read_text())
        assert state["warm"][f"{name}:prod"]["artifact_id"] == str(made[2].id)
        assert int(state["last_event_id"]) > 0
        # Verified bytes: each object is exactly what the registry stored.
        for path, data in made[2].files.items():
            assert cache.path(made[2].sha256(path)).read_bytes() == data
    finally:
        assert agent.stop() == 0, agent.output()
    assert "stopped" in agent.output()


def test_a_move_while_the_agent_is_down_is_replayed_from_its_last_event(
    registry: Registry, tmp_path: Path
) -> None:
    name = _name()
    made = _artifacts(registry, name, 3)
    _move(registry, name, 1)
    cache_dir, state_dir = tmp_path / "cache", tmp_path / "state"
    cache = NodeCache(cache_dir)
    agent = AgentProcess(
        registry, cache_dir, "--watch", f"{name}:prod", "--state-dir", str(state_dir)
    )
    try:
        _wait_warm(cache, made[0], agent)
        poll(lambda: (state_dir / "state.json").exists(), what="the agent's state")
    finally:
        assert agent.stop() == 0, agent.output()
    # Moves while no agent runs: the next start replays them from the persisted event id.
    _move(registry, name, 2)
    _move(registry, name, 3)
    agent = AgentProcess(
        registry, cache_dir, "--watch", f"{name}:prod", "--state-dir", str(state_dir)
    )
    try:
        _wait_warm(cache, made[2], agent)
    finally:
        assert agent.stop() == 0, agent.output()


def test_two_agents_on_one_node_download_each_file_once(registry: Registry, tmp_path: Path) -> None:
    name = _name()
    made = _artifacts(registry, name, 2)
    _move(registry, name, 1)
    cache_dir = tmp_path / "cache"
    cache = NodeCache(cache_dir)
    agents = [
        AgentProcess(
            registry, cache_dir, "--watch", f"{name}:prod", "--state-dir", str(tmp_path / f"s{i}")
        )
        for i in range(2)
    ]
    try:
        for agent in agents:
            _wait_warm(cache, made[0], agent)
        _move(registry, name, 2)
        _wait_warm(cache, made[1], agents[0])
        for agent in agents:  # both handled the move (the second found it pulled)
            poll(
                lambda agent=agent: f"{name}:prod: warm on version 2" in agent.output(),  # type: ignore[misc]
                what="both agents warm on version 2",
                detail=agent.output,
            )
        # Sizes in the CLI's decimal units, not raw byte counts.
        warm = re.findall(
            r"warm on version \d+ \(artifact \S+, (.*?) downloaded\)", agents[0].output()
        )
        assert warm and all(re.fullmatch(r"\d+ B|[\d.]+ [kMGT]B", w) for w in warm), warm
    finally:
        for agent in agents:
            assert agent.stop() == 0, agent.output()
    fetched = [r["path"].rsplit("/", 1)[1] for r in registry.blob_requests()]
    for artifact, expected in zip(
        made,
        # The second version shares its config and tokenizer bytes: only its weights are new.
        (sorted(made[0].files), ["model.tensors"]),
        strict=True,
    ):
        prefix = f"/api/v1/blobs/local/artifacts/{artifact.id}/"
        paths = [r["path"] for r in registry.blob_requests() if r["path"].startswith(prefix)]
        assert sorted(p.removeprefix(prefix) for p in paths) == expected, fetched


def test_the_budget_prunes_old_objects_but_never_what_a_watch_is_warm_on(
    registry: Registry, tmp_path: Path
) -> None:
    first, second = _name(), _name()
    a = _artifacts(registry, first, 2)
    b = _artifacts(registry, second, 1, seed=200)
    _move(registry, first, 1)
    _move(registry, second, 1)
    size = max(sum(len(d) for d in m.files.values()) for m in (*a, *b))
    cache_dir = tmp_path / "cache"
    cache = NodeCache(cache_dir)
    # Room for two artifacts (their small files are shared: same config and tokenizer).
    budget = str(2 * size + 1024)
    agent = AgentProcess(
        registry,
        cache_dir,
        "--watch",
        f"{first}:prod",
        "--watch",
        f"{second}:prod",
        "--max-cache-size",
        budget,
        "--state-dir",
        str(tmp_path / "state"),
    )
    try:
        _wait_warm(cache, a[0], agent)
        _wait_warm(cache, b[0], agent)
        _move(registry, first, 2)
        _wait_warm(cache, a[1], agent)
        assert cache.size() <= int(budget)
        # The other watch's artifact stayed; the moved-away version made room.
        assert _holds(cache, b[0])
        assert not cache.contains(a[0].sha256("model.tensors"), len(a[0].files["model.tensors"]))
    finally:
        assert agent.stop() == 0, agent.output()


def test_without_the_event_stream_the_agent_polls_with_backoff(
    registry: Registry, tmp_path: Path
) -> None:
    """Behind a proxy that answers 503 for the event stream (an old load balancer rule, a
    registry mid-upgrade), moves are still found: by polling, with backoff."""
    upstream = registry.url

    class Proxy(QuietHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/api/v1/events"):
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            forwarded = {
                k: v for k, v in self.headers.items() if k.lower() in ("authorization", "range")
            }
            answer = httpx.get(upstream + self.path, headers=forwarded, timeout=30)
            self.send_response(answer.status_code)
            for key, value in answer.headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

    name = _name()
    made = _artifacts(registry, name, 2, seed=300)
    _move(registry, name, 1)
    cache_dir = tmp_path / "cache"
    cache = NodeCache(cache_dir)
    with serving(Proxy) as proxy:
        agent = AgentProcess(
            registry,
            cache_dir,
            "--url",
            proxy,
            "--watch",
            f"{name}:prod",
            "--max-backoff",
            "2",
            "--state-dir",
            str(tmp_path / "state"),
        )
        try:
            _wait_warm(cache, made[0], agent)
            _move(registry, name, 2)
            _wait_warm(cache, made[1], agent)
            assert "event stream down" in agent.output()
        finally:
            assert agent.stop() == 0, agent.output()


def test_a_failed_pre_pull_is_tried_again_without_a_new_event(
    registry: Registry, tmp_path: Path
) -> None:
    """A blob the registry cannot serve for a moment (a 500 under load, a store restarting;
    here its file is away) fails the pre-pull. The agent tries again with backoff and becomes
    warm with no move and no event after it: the fleet bench saw 3 of 32 agents stay cold for
    minutes after one 500, waiting for a move that never came."""
    name = _name()
    (made,) = _artifacts(registry, name, 1, seed=500)
    _move(registry, name, 1)
    tensors = made.directory / next(p for p in made.files if p.endswith(".tensors"))
    away = tensors.with_name("away")
    tensors.rename(away)
    cache_dir = tmp_path / "cache"
    cache = NodeCache(cache_dir)
    agent = AgentProcess(
        registry,
        cache_dir,
        *("--watch", f"{name}:prod", "--max-backoff", "2"),
        *("--state-dir", str(tmp_path / "state")),
    )
    try:
        poll(
            lambda: "failed (" in agent.output(),
            what="the first pre-pull to fail",
            timeout=60,
            detail=agent.output,
        )
        assert not _holds(cache, made)
        away.rename(tensors)
        _wait_warm(cache, made, agent, timeout=30)
        assert "trying the pre-pull again" in agent.output()
        state = json.loads((tmp_path / "state" / "state.json").read_text())
        assert state["warm"][f"{name}:prod"]["artifact_id"] == str(made.id)
        assert "failed" not in state["warm"][f"{name}:prod"]
    finally:
        if away.exists():
            away.rename(tensors)
        assert agent.stop() == 0, agent.output()


def test_a_pre_pull_that_raises_is_tried_again_later_not_at_once(tmp_path: Path) -> None:
    """A resolve that raises (here OSError, as a full disk would) is scheduled after the
    backoff, never left due: the retry thread would otherwise call it again in a tight loop."""

    class Down:
        calls = 0

        def resolve(self, *args: object, **kwargs: object) -> None:
            Down.calls += 1
            raise OSError("no space left on device")

    watch = Watch("acme/a", "prod")
    agent = Agent(
        Down(),  # type: ignore[arg-type]
        NodeCache(tmp_path / "cache"),
        [watch],
        state_dir=tmp_path / "state",
        max_backoff=30,
        node_id="node-a",
    )
    for attempt in (1, 2):
        with pytest.raises(OSError):
            agent.warm_watch(watch)
        count, due = agent._retries[watch.label]
        assert count == attempt and due > time.monotonic()
    assert Down.calls == 2


def test_alias_set_waits_until_the_watching_nodes_are_warm(
    registry: Registry, tmp_path: Path
) -> None:
    """The agent checks in what it is warm on; `alias set --wait-warm` follows the rollout
    until that share of the watching nodes is warm; with no watching node (the agent stopped
    and said so) it exits 1 at once."""
    name = _name()
    made = _artifacts(registry, name, 2, seed=400)
    _move(registry, name, 1)
    cache_dir, state_dir = tmp_path / "cache", tmp_path / "state"
    args = ("--watch", f"{name}:prod", "--state-dir", str(state_dir), "--node-id", "node-a")
    agent = AgentProcess(registry, cache_dir, *args)
    with registry.http() as http:
        model_id = http.get("/api/v1/models", params={"name": name}).json()["items"][0]["id"]

        def rollout() -> dict[str, object]:
            return dict(http.get(f"/api/v1/models/{model_id}/aliases/prod/rollout").json())

        try:
            poll(
                lambda: [n["id"] for n in rollout()["warm"]] == ["node-a"],  # type: ignore[attr-defined]
                what="node-a checked in warm on version 1",
                detail=agent.output,
            )
        finally:
            assert agent.stop() == 0, agent.output()

        # The agent said it stopped: nobody watches, and --wait-warm says so (exit 1) instead
        # of waiting for a node that will not move, or reporting success.
        late = registry.cli(
            "alias", "set", name, "prod", "2", "--wait-warm", "100%", "--wait-timeout", "60"
        )
        assert late.returncode == 1, late.stderr
        assert f"no live node watches {name}:prod" in late.stderr
        assert "no_watching_node" in late.stderr
        assert rollout()["watching"] == 0

        agent = AgentProcess(registry, cache_dir, *args)
        try:
            # Back: --wait-warm counts it once its first check-in says it watches again.
            poll(
                lambda: rollout()["watching"] == 1,
                what="node-a watching again after its restart",
                detail=agent.output,
            )
            done = registry.cli(
                "alias", "set", name, "prod", "2", "--wait-warm", "90%", "--wait-timeout", "120"
            )
            assert done.returncode == 0, done.stderr + agent.output()
            assert "1 of 1 watching node(s) warm on version 2 (100%)" in done.stderr
            assert _holds(NodeCache(cache_dir), made[1])
        finally:
            assert agent.stop() == 0, agent.output()
    nodes = registry.http().get("/api/v1/nodes?include_stale=true").json()["items"]
    [node] = [n for n in nodes if n["id"] == "node-a"]
    assert node["status"] == "stopped"  # its agent stopped last, and said so
    assert node["watches"] == [
        {
            "model": name,
            "ref": "prod",
            "state": "warm",
            "version": 2,
            "artifact_id": str(made[1].id),
            "error": None,
        }
    ]
    assert str(made[1].id) in node["cached"]


def test_a_long_reason_is_cut_between_words() -> None:
    reason = " ".join(["unreachable"] * 40)
    short = _short(RuntimeError(reason))
    assert len(short) <= 200 and short.endswith(" ...")
    assert all(word == "unreachable" for word in short.removesuffix(" ...").split())
    url = "http://127.0.0.1:9/" + "a" * 300
    assert _short(RuntimeError(f"{url} refused")) == f"{url} ..."
    assert _short(RuntimeError("short  and\nplain")) == "short and plain"
