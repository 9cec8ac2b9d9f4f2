"""The Webhooks page in Chromium against the UI's `serve`: create a webhook with the form (its
secret shown once), see the delivery of an alias move to a receiver on 127.0.0.1, redeliver it
with the button (the same webhook-id arrives again), delete the webhook. And the fleet pages'
fixes: a pending node with no matching artifact is "waiting", not "pulling"; a long reason is one
line with an ellipsis (the whole text its title); the Nodes page lists recent loads and says a
node that only pulled runs "pull", not an agent.
Screenshots: test-artifacts/ui/webhooks*.png, nodes-loads.png."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from harness.loopback import QuietHandler, serving
from tests.ui.conftest import VIEW_DRAWN, Server, shot
from tests.ui.test_fleet_pages import fleet_model, open_rollout  # noqa: F401 (fixture)
from tests.ui.test_pages import CONTRAST_JS, unnamed_controls

try:
    from playwright.sync_api import expect
except ImportError:  # the conftest skips these tests without Playwright
    expect = None

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.browser
LIVE = 30_000


class Got:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[str] = []

    def received(self) -> list[str]:
        with self.lock:
            return list(self.ids)


@pytest.fixture
def receiver() -> Iterator[tuple[str, Got]]:
    got = Got()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            with got.lock:
                got.ids.append(self.headers["webhook-id"])
            self.send_response(204)
            self.end_headers()

    with serving(Handler) as url:
        yield url + "/hook", got


def test_the_webhooks_page_creates_lists_redelivers_and_deletes(
    signed_in: Page,
    ui_server: Server,
    fleet_model: dict[str, Any],  # noqa: F811
    receiver: tuple[str, Got],
) -> None:
    page = signed_in
    url, got = receiver
    namespace = fleet_model["name"].split("/")[0]
    page.goto("/#/webhooks")
    expect(page.locator("main h1")).to_have_text("Webhooks")
    page.get_by_label("Namespace").fill(namespace)
    page.get_by_label("URL").fill(url)
    page.get_by_label("alias.moved").check()
    page.get_by_role("button", name="Create webhook").click()
    secret = page.locator("#new-webhook-secret")
    expect(secret).to_contain_text("whsec_")
    row = page.locator("tr[data-webhook]").filter(has_text=url)
    expect(row).to_have_count(1)
    expect(row).to_contain_text("alias.moved")
    shot(page, "webhooks")
    assert unnamed_controls(page) == []
    assert page.evaluate(CONTRAST_JS) == []

    current = ui_server.api.get(f"/models/{fleet_model['id']}/aliases/prod").json()["version"]
    moved = ui_server.api.put(
        f"/models/{fleet_model['id']}/aliases/prod", json={"version": 2 if current == 1 else 1}
    )
    assert moved.status_code == 200, moved.text
    row.get_by_role("link").click()
    delivery = page.locator("tr[data-delivery]").first
    # The page is re-read until the delivery went out (the list is read once per visit).
    for _ in range(LIVE // 1000):
        # Read once the view is drawn: checked at once after a reload, the list was never
        # there yet, and the loop always ran out its 30 s before the expect below.
        page.locator(VIEW_DRAWN).wait_for()
        if "succeeded" in (delivery.inner_text() if delivery.count() else ""):
            break
        page.wait_for_timeout(1000)
        page.reload()
    expect(delivery.locator(".badge")).to_have_text("succeeded")
    expect(delivery).to_contain_text("HTTP 204")
    assert len(got.received()) == 1
    shot(page, "webhook-deliveries")
    delivery.get_by_role("button", name="Redeliver").click()
    for _ in range(LIVE // 500):
        if len(got.received()) >= 2:
            break
        page.wait_for_timeout(500)
    first, again = got.received()[:2]
    assert first == again, "a redelivery keeps its webhook-id"

    page.goto("/#/webhooks")
    row = page.locator("tr[data-webhook]").filter(has_text=url)
    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Confirm: delete").click()
    expect(page.locator("tr[data-webhook]").filter(has_text=url)).to_have_count(0)


def test_waiting_nodes_long_reasons_and_recent_loads(
    signed_in: Page,
    ui_server: Server,
    fleet_model: dict[str, Any],  # noqa: F811
) -> None:
    page = signed_in
    name = fleet_model["name"]
    waiting, puller = f"wait-{secrets.token_hex(3)}", f"pull-{secrets.token_hex(3)}"
    reason = "nothing to pre-pull yet: no artifact matches dtype=bfloat16 " + "and more " * 40
    body = {
        "node_id": waiting,
        "hostname": "gpu-w",
        "agent_version": "0.1.0",
        "watches": [{"model": name, "ref": "prod", "state": "pending", "error": reason[:500]}],
    }
    assert ui_server.api.post("/nodes/checkin", json=body).status_code == 200
    pulled = {
        "node_id": puller,
        "hostname": "gpu-p",
        "agent_version": "0.1.0",
        "loaded": [{"by": "pull", "model": name, "ref": "prod", "version": 1, "path": "pull",
                    "seconds": 2.5, "gbps": 1.25, "verified": True}],
    }  # fmt: skip
    assert ui_server.api.post("/nodes/checkin", json=pulled).status_code == 200

    open_rollout(page, fleet_model)
    row = page.locator(f'tr[data-node="{waiting}"]')
    expect(row.locator(".badge")).to_have_text("waiting")
    assert int(page.locator('.rollout-legend [data-count="waiting"]').inner_text()) >= 1
    expect(page.locator(".rollout-legend")).to_contain_text("waiting: no matching artifact")

    page.goto("/#/nodes")
    listed = page.locator(f'tr[data-node="{waiting}"]')
    cut = listed.locator(".reason.truncate")
    expect(cut).to_have_attribute("title", reason[:500])
    # One line, not a column of wrapped words.
    height = cut.evaluate("el => el.getBoundingClientRect().height")
    line = cut.evaluate("el => parseFloat(getComputedStyle(el).lineHeight) || 24")
    assert height <= line * 1.5, (height, line)
    assert listed.evaluate("el => el.getBoundingClientRect().height") < 200
    other = page.locator(f'tr[data-node="{puller}"]')
    expect(other.locator("td.runs")).to_have_text("pull 0.1.0")
    expect(other.locator("td.loads")).to_contain_text(f"{name}:prod")
    expect(other.locator("td.loads")).to_contain_text("pull 2.5 s, 1.25 GB/s, verified")
    expect(listed.locator("td.runs")).to_have_text("agent 0.1.0")
    shot(page, "nodes-loads")


def test_jobs_rate_agrees_with_took_and_class_names_break_between_words(signed_in: Page) -> None:
    page = signed_in
    page.goto("/#/models")
    expect(page.locator("main h1")).to_be_visible()
    shown = page.evaluate(
        """async () => {
          const { shownRate } = await import('/ui/js/views/jobs.js');
          const { className } = await import('/ui/js/dom.js');
          // 1 GB in 10 s: the table says 100 MB/s beside "took 10 s", not the writer's 500 MB/s.
          const finished = shownRate({ status: 'succeeded', started_at: '2026-12-06T10:00:00Z',
            finished_at: '2026-12-06T10:00:10Z', progress: { bytes_done: 1e9 },
            result: { bytes_per_second: 5e8 } });
          // A card narrower than the name: each word stays on one line.
          const dl = document.createElement('dl');
          dl.className = 'facts';
          dl.style.width = '70px';
          const div = document.createElement('div');
          const dd = document.createElement('dd');
          dd.append(className('LlamaForCausalLM'));
          div.append(dd);
          dl.append(div);
          document.querySelector('main').append(dl);
          const words = [...dd.querySelector('.class-name').childNodes]
            .filter((n) => n.nodeType === 3)
            .map((n) => {
              const range = document.createRange();
              range.selectNodeContents(n);
              const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
              return [n.textContent, tops.size];
            });
          const height = dd.getBoundingClientRect().height;
          dl.remove();
          return { finished, words, height };
        }"""
    )
    assert shown["finished"] == 1e8
    assert [w for w, _ in shown["words"]] == ["Llama", "For", "Causal", "LM"]
    assert all(lines == 1 for _, lines in shown["words"]), shown["words"]
