"""The agent refuses a tampered answer's target and keeps watching (issue 33 §5): an unsafe path
in a lying registry's answer made it exit (nothing written, but a crash loop under systemd).
Now that watch is reported failed in its check-in, and the agent goes on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tensor_registry import NodeCache, RegistryClient
from tensor_registry.agent.agent import Agent, Watch
from tests.client.lying_server import Liar


@pytest.mark.parametrize("lie", ["../../escape", "/etc/planted", "a/../../b", "ok/./x"])
def test_an_unsafe_path_in_an_answer_is_a_failed_watch_not_an_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lie: str
) -> None:
    monkeypatch.setenv("TENSOR_REGISTRY_ALLOW_UNSIGNED", "1")
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("TENSOR_REGISTRY_NO_CHECKIN", raising=False)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        "tensor_registry.agent.agent.checkins.post", lambda _client, body: sent.append(body)
    )
    liar = Liar()
    liar.file("config.json", b"{}")
    liar.file(lie, b"planted by a lying registry")
    lines: list[str] = []
    with liar.serving() as url:
        client = RegistryClient(url, "trt_liar")
        agent = Agent(
            client,
            NodeCache(tmp_path / "cache"),
            [Watch("acme/liar", "prod")],
            state_dir=tmp_path / "state",
            stop=threading.Event(),
            report=lines.append,
            node_id="node-under-test",
        )
        # What the loop runs on start and after every event: no exception leaves it.
        agent.catch_up()
        assert agent.warm_watch(Watch("acme/liar", "prod")) is False
    entry = agent.state.warm["acme/liar:prod"]
    assert "unsafe_path" in entry["failed"] or "path" in entry["failed"], entry
    watches = sent[-1]["watches"]
    assert watches[0]["state"] == "failed" and watches[0]["error"], sent[-1]
    assert any("failed" in line for line in lines), lines
    assert not any("planted" in p.name for p in tmp_path.rglob("*"))
    assert not [r for r in liar.requests if r[0].startswith("/blob")], liar.requests
