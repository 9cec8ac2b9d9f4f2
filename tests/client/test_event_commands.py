"""`tensor-registry webhooks | events | nodes` through a real `serve` (its own, with loopback
allow-listed as the README says to, since the receiver runs on 127.0.0.1), and the README's and
docs/events.md's webhook `curl` run as written against it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks import Webhook as StandardWebhook

from harness.serve_process import ROOT
from harness.waiting import poll
from tests.api.test_webhooks import Receiver, receiver  # noqa: F401 (fixture)
from tests.client.conftest import Registry, serving_registry

ALLOW = "TENSOR_REGISTRY_FETCH__ALLOW"


@pytest.fixture(scope="module")
def allowing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    readme = (ROOT / "README.md").read_text()
    # The README's webhook section names the setting that allows a receiver on localhost.
    assert f"{ALLOW}='[\"127.0.0.1\"]'" in readme
    with serving_registry(tmp_path_factory, {ALLOW: '["127.0.0.1"]'}) as registry:
        yield registry


def _curl_blocks() -> list[str]:
    found = []
    for doc in ("README.md", "docs/events.md"):
        text = (ROOT / doc).read_text()
        [block] = [
            b for b in re.findall(r"```\w*\n(.*?)```", text, re.S) if "/api/v1/webhooks" in b
        ]
        found.append(block)
    return found


def test_the_documented_webhook_curl_creates_one(
    allowing: Registry,
    receiver: Receiver,  # noqa: F811
) -> None:
    for block in _curl_blocks():
        command = block.split("\n# ", 1)[0].replace(
            "https://hooks.example.com/registry", receiver.url
        )
        # Only the status code added, after the body.
        command = command.replace("curl ", 'curl -s -w "\\n%{http_code}" ', 1)
        env = {
            **allowing.cli_env(),
            "URL": allowing.url,
            "TOKEN": allowing.token,
        }
        done = subprocess.run(
            ["bash", "-c", command],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        body, _, code = done.stdout.rpartition("\n")
        assert code == "201", done.stdout + done.stderr
        created = json.loads(body)
        assert created["secret"].startswith("whsec_") and created["url"] == receiver.url


def _cli(reg: Registry, *args: str) -> subprocess.CompletedProcess[str]:
    done = reg.cli(*args)
    assert done.returncode == 0, done.stderr
    return done


def test_webhooks_events_and_nodes_from_the_command_line(
    allowing: Registry,
    receiver: Receiver,  # noqa: F811
    tmp_path: Path,
) -> None:
    reg = allowing
    created = json.loads(
        _cli(
            reg, "webhooks", "create", "acme", receiver.url, "--event", "alias.moved", "--json"
        ).stdout
    )
    hook_id, secret = created["id"], created["secret"]
    listed = _cli(reg, "webhooks", "ls").stdout
    assert hook_id in listed and "alias.moved" in listed and "enabled" in listed
    shown = _cli(reg, "webhooks", "show", hook_id).stdout
    assert "url:" in shown and receiver.url in shown and "secret" not in shown

    # The event stream, followed from the command line while an alias moves.
    follow = subprocess.Popen(
        [sys.executable, "-m", "tensor_registry.cli", "events", "follow", "--json",
         "--type", "alias.moved", "--count", "1"],
        cwd=ROOT, env=reg.cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        poll(
            lambda: follow.stderr is not None and "following events" in follow.stderr.readline(),
            what="the stream to open",
            timeout=60,
        )
        model = reg.ready_model("acme/cli-events")
        with reg.http() as http:
            moved = http.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1})
            assert moved.status_code in (200, 201), moved.text
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    [event] = [json.loads(line) for line in out.splitlines()]
    assert event["type"] == "alias.moved" and event["data"]["model"] == "acme/cli-events"

    # The delivery, verified with the Standard Webhooks library, and listed by the CLI.
    got = poll(lambda: receiver.received(), what="the delivery", timeout=60)
    headers, body = got[0]
    assert StandardWebhook(secret).verify(body, headers)["id"] == event["id"]
    deliveries = poll(
        lambda: [
            d
            for d in json.loads(_cli(reg, "webhooks", "deliveries", hook_id, "--json").stdout)
            if d["status"] == "succeeded"
        ],
        what="a succeeded delivery",
        timeout=60,
    )
    delivery_id = deliveries[0]["id"]
    table = _cli(reg, "webhooks", "deliveries", hook_id).stdout
    assert delivery_id in table and "succeeded" in table and "200" in table

    again = _cli(reg, "webhooks", "redeliver", hook_id, delivery_id).stdout
    assert delivery_id in again
    resent = poll(lambda: receiver.received()[1:], what="the redelivery", timeout=60)
    assert resent[0][0]["webhook-id"] == headers["webhook-id"]

    # Nodes: one that only pulled runs "pull", not "agent".
    with reg.http() as http:
        checked = http.post(
            "/api/v1/nodes/checkin",
            json={
                "node_id": "cli-node-01",
                "hostname": "gpu-host",
                "loaded": [
                    {"by": "pull", "model": "acme/cli-events", "ref": "prod", "version": 1,
                     "path": "pull", "seconds": 1.5, "gbps": 2.25, "verified": True}
                ],
            },
        )  # fmt: skip
        assert checked.status_code == 200, checked.text
    nodes = json.loads(_cli(reg, "nodes", "ls", "--json").stdout)
    assert "cli-node-01" in {n["id"] for n in nodes}
    table = _cli(reg, "nodes", "ls").stdout
    [row] = [line for line in table.splitlines() if line.startswith("cli-node-01")]
    assert "gpu-host" in row and " pull " in row and "agent" not in row
    shown = _cli(reg, "nodes", "show", "cli-node-01").stdout
    assert "acme/cli-events:prod" in shown and "2.25" in shown and "verified" in shown
    missing = reg.cli("nodes", "show", "no-such-node")
    assert missing.returncode == 1 and "no-such-node" in missing.stderr

    # Off and on again from the command line (a webhook disabled after failures is re-enabled
    # the same way; the failure count starts again).
    off = _cli(reg, "webhooks", "disable", hook_id).stdout
    assert off.strip() == f"webhook {hook_id}: disabled: disabled by hand"
    assert "disabled" in _cli(reg, "webhooks", "show", hook_id).stdout
    on = json.loads(_cli(reg, "webhooks", "enable", hook_id, "--json").stdout)
    assert on["enabled"] is True and on["consecutive_failures"] == 0
    assert "enabled" in _cli(reg, "webhooks", "show", hook_id).stdout

    removed = reg.cli("webhooks", "rm", hook_id, "--yes")
    assert removed.returncode == 0, removed.stderr
    gone = reg.cli("webhooks", "show", hook_id)
    assert gone.returncode == 1, gone.stdout
