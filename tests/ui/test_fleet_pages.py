"""The rollout page and the nodes page in Chromium against the session's `serve`: the test posts
check-ins as the agent does (POST /api/v1/nodes/checkin) and the open page follows them, without
a reload, from 0 of 3 warm to 3 of 3; what nodes report (hostnames, failure reasons) is shown as
text, never as markup; nodes that stopped checking in are counted apart.
Screenshots: test-artifacts/ui/rollout-*.png, nodes.png.
"""

from __future__ import annotations

import secrets
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.hf_fixtures import make_tiny_gpt2
from tests.ui.conftest import Server, close_page, new_page, publish, shot, sign_in
from tests.ui.test_pages import CONTRAST_JS, assert_fits_a_phone, unnamed_controls

try:
    from playwright.sync_api import expect
except ImportError:  # the conftest skips these tests without Playwright
    expect = None

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.browser

HOSTILE_HOSTNAME = '<img src=x onerror="window.__pwned=1"><b>gpu-7</b>'
# Longest wait for the page to follow a change: a few of its 2-second re-reads on a busy machine.
LIVE = 15_000
HOSTILE_REASON = "<script>window.__pwned=1</script>disk full & <i>retrying</i>"


@pytest.fixture(scope="module")
def fleet_model(ui_server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A model with two ready versions and `prod` on version 1."""
    directory = make_tiny_gpt2(tmp_path_factory.mktemp("fleet") / "tiny")
    api = ui_server.api
    name = f"acme/fleet-{secrets.token_hex(3)}"
    model = api.post("/models", json={"name": name}).json()
    assert publish(api, model["id"], directory, finalize=True) == 1
    assert publish(api, model["id"], directory, finalize=True) == 2
    assert api.put(f"/models/{model['id']}/aliases/prod", json={"version": 1}).status_code == 201
    return dict(model)


def check_in(
    server: Server,
    node_id: str,
    model: str,
    state: str,
    version: int | None,
    *,
    hostname: str | None = None,
    error: str | None = None,
) -> None:
    """What the agent posts (tensor_registry/agent/agent.py checkin_body)."""
    artifact_id = "0b5e2a44-6f3c-4c1e-9a51-7d2f7f0c9e10" if state == "warm" else None
    body = {
        "node_id": node_id,
        "hostname": hostname or f"{node_id}.gpu.internal",
        "agent_version": "0.1.0",
        "gpus": [{"name": "NVIDIA H100", "memory_bytes": 80 << 30}],
        "watches": [
            {"model": model, "ref": "prod", "state": state, "version": version,
             "artifact_id": artifact_id, "error": error}
        ],
        "cached": [artifact_id] if artifact_id else [],
    }  # fmt: skip
    r = server.api.post("/nodes/checkin", json=body)
    assert r.status_code == 200, r.text


def open_rollout(page: Page, model: dict[str, Any]) -> None:
    page.goto(f"/#/models/{model['id']}")
    page.get_by_role("link", name="prod rollout").click()
    expect(page.locator("main h1")).to_have_text("Rollout of prod")
    expect(page.locator("[aria-busy=true]")).to_have_count(0)


def counts(page: Page) -> tuple[int, ...]:
    """The legend's (warm, previous, pending, failed, stale) counts."""
    return tuple(
        int(page.locator(f'.rollout-legend [data-count="{state}"]').inner_text())
        for state in ("warm", "previous", "pending", "failed", "stale")
    )


def test_the_rollout_page_follows_check_ins_from_0_to_3_warm_without_a_reload(
    signed_in: Page, ui_server: Server, fleet_model: dict[str, Any]
) -> None:
    page = signed_in
    name = fleet_model["name"]
    nodes = [f"conv-{secrets.token_hex(3)}-{i}" for i in range(3)]
    for node in nodes:
        check_in(ui_server, node, name, "warm", 1)
    moved = ui_server.api.put(f"/models/{fleet_model['id']}/aliases/prod", json={"version": 2})
    assert moved.status_code == 200, moved.text

    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    open_rollout(page, fleet_model)
    warm = page.locator('.rollout-count [data-count="warm"]')
    expect(warm).to_have_text("0 / 3", timeout=LIVE)
    expect(page.get_by_role("heading", name="Target: version 2")).to_be_visible()
    assert counts(page) == (0, 3, 0, 0, 0)
    for node in nodes:
        holds = page.locator(f'tr[data-node="{node}"] td').nth(2)
        expect(holds).to_have_text("version 1 · artifact 0b5e2a44…")
    shot(page, "rollout-start")
    assert unnamed_controls(page) == []
    assert page.evaluate(CONTRAST_JS) == []
    # A marker that a reload or a navigation would wipe.
    page.evaluate("window.__sameDocument = true")

    check_in(ui_server, nodes[0], name, "warm", 2)
    check_in(ui_server, nodes[1], name, "pending", 1)
    check_in(ui_server, nodes[2], name, "failed", 1, error="pull failed: 503 from the registry")
    expect(warm).to_have_text("1 / 3", timeout=LIVE)
    expect(page.locator(".rollout-legend [data-count=failed]")).to_have_text("1")
    assert counts(page) == (1, 0, 1, 1, 0)
    failed_row = page.locator(f'tr[data-node="{nodes[2]}"]')
    expect(failed_row.locator("td.reason")).to_have_text("pull failed: 503 from the registry")
    expect(failed_row.locator(".badge")).to_have_text("failed")
    expect(page.locator(".rollout-bar .rollout-segment")).to_have_count(3)
    shot(page, "rollout-halfway")

    for node in nodes[1:]:
        check_in(ui_server, node, name, "warm", 2)
    expect(warm).to_have_text("3 / 3", timeout=LIVE)
    assert counts(page) == (3, 0, 0, 0, 0)
    expect(page.locator(".rollout-bar .rollout-segment")).to_have_count(1)
    whole = page.locator('.rollout-bar [data-state="warm"]')
    expect(whole).to_have_attribute("style", "width: 100%;")
    assert page.evaluate("window.__sameDocument") is True
    shot(page, "rollout-done")
    # Alias moves come from the event stream (check-ins come from the re-reads).
    stream = f"{ui_server.url}/api/v1/events?types=alias.moved%2Calias.deleted"
    assert requested.count(stream) == 1, [u for u in requested if "/events" in u]

    # The alias moves again: the page shows the new target and everyone back on "previous".
    back = ui_server.api.put(f"/models/{fleet_model['id']}/aliases/prod", json={"version": 1})
    assert back.status_code == 200, back.text
    expect(page.get_by_role("heading", name="Target: version 1")).to_be_visible(timeout=LIVE)
    expect(warm).to_have_text("0 / 3", timeout=LIVE)
    assert page.evaluate("window.__sameDocument") is True


def test_node_reported_strings_are_shown_as_text(
    signed_in: Page, ui_server: Server, fleet_model: dict[str, Any]
) -> None:
    page = signed_in
    node = f"evil-{secrets.token_hex(3)}"
    check_in(
        ui_server, node, fleet_model["name"], "failed", 1,
        hostname=HOSTILE_HOSTNAME, error=HOSTILE_REASON,
    )  # fmt: skip
    open_rollout(page, fleet_model)
    row = page.locator(f'tr[data-node="{node}"]')
    expect(row.locator("td.hostname")).to_have_text(HOSTILE_HOSTNAME)
    expect(row.locator("td.reason")).to_have_text(HOSTILE_REASON)
    assert row.locator("img, b, i, script").count() == 0

    page.goto("/#/nodes")
    expect(page.locator("main h1")).to_have_text("Nodes")
    listed = page.locator(f'tr[data-node="{node}"]')
    expect(listed.locator("td.hostname")).to_have_text(HOSTILE_HOSTNAME)
    expect(listed.locator(".reason")).to_contain_text(HOSTILE_REASON)
    assert listed.locator("img, b, i, script").count() == 0
    assert page.evaluate("window.__pwned") is None


def age_node(server: Server, node_id: str, hours: float) -> None:
    """The node's last check-in moved back in the server's own database (SQLite): what a node
    that went quiet looks like after that long."""
    db = Path(server.process.data_dir) / "registry.db"
    with sqlite3.connect(db, timeout=10) as conn:
        [(seen,)] = conn.execute("SELECT last_seen_at FROM nodes WHERE id = ?", (node_id,))
        earlier = datetime.fromisoformat(seen) - timedelta(hours=hours)
        stored = earlier.isoformat(sep=" " if " " in seen else "T")
        conn.execute("UPDATE nodes SET last_seen_at = ? WHERE id = ?", (stored, node_id))


def test_nodes_that_stopped_checking_in_count_as_stale_and_the_nodes_page_lists_them(
    signed_in: Page, ui_server: Server, fleet_model: dict[str, Any]
) -> None:
    page = signed_in
    name = fleet_model["name"]
    current = ui_server.api.get(f"/models/{fleet_model['id']}/aliases/prod").json()["version"]
    live, quiet = f"live-{secrets.token_hex(3)}", f"quiet-{secrets.token_hex(3)}"
    check_in(ui_server, live, name, "warm", current)
    check_in(ui_server, quiet, name, "warm", current)
    age_node(ui_server, quiet, hours=2)

    open_rollout(page, fleet_model)
    expect(page.locator(f'tr[data-node="{quiet}"] .badge')).to_have_text("stale")
    expect(page.locator(f'tr[data-node="{quiet}"] time')).to_have_text("2 h 0 min ago")
    expect(page.locator(f'tr[data-node="{live}"] .badge')).to_have_text("warm")
    assert counts(page)[4] >= 1

    page.goto("/#/nodes")
    expect(page.locator("main h1")).to_have_text("Nodes")
    expect(page.locator(f'tr[data-node="{live}"] .badge').first).to_have_text("live")
    expect(page.locator(f'tr[data-node="{quiet}"]')).to_have_count(0)
    page.get_by_label("Include stale nodes").check()
    expect(page.locator(f'tr[data-node="{quiet}"] td').nth(1)).to_have_text("stale")
    expect(page).to_have_url(f"{ui_server.url}/#/nodes?stale=1")
    shot(page, "nodes")
    assert unnamed_controls(page) == []
    assert page.evaluate(CONTRAST_JS) == []


def test_a_missing_alias_says_so_and_the_page_fits_a_phone(
    browser: Browser, ui_server: Server, fleet_model: dict[str, Any]
) -> None:
    page = new_page(browser, ui_server, width=375, height=812)
    try:
        sign_in(page, ui_server.token)
        check_in(ui_server, f"phone-{secrets.token_hex(3)}", fleet_model["name"], "failed", 1,
                 hostname="a-very-long-hostname-" * 4, error="x" * 300)  # fmt: skip
        open_rollout(page, fleet_model)
        shot(page, "phone-rollout")
        assert_fits_a_phone(page, "rollout")

        page.goto(f"/#/models/{fleet_model['id']}/aliases/canary/rollout")
        expect(page.locator("main h1")).to_have_text("Rollout of canary")
        problem = page.get_by_role("alert")
        expect(problem).to_contain_text("Could not read the rollout")
        expect(problem).to_contain_text("alias_not_found")
    finally:
        close_page(page)
