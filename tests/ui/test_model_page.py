"""The model page as people read it (card, facts, dtypes, files, variant matrix, deletes that
ask first), the models list's summary columns, the jobs page, the audit table and the activity
charts, in Chromium against the session's `serve`. Screenshots: test-artifacts/ui/model-*.png,
models-list.png, jobs-*.png, audit-table.png, activity.png.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.waiting import wait_job_sync
from tensor_registry.cli.output import format_size
from tests.hf_fixtures import make_tiny_gpt2
from tests.ui.conftest import Seed, Server, publish, shot

try:
    from playwright.sync_api import expect
except ImportError:  # the conftest skips these tests without Playwright
    expect = None

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.browser

RATE = re.compile(r"[\d.]+ (B|kB|MB|GB)/s")


def open_page(page: Page, url: str) -> None:
    page.goto(f"/{url}")
    page.locator("main h1").first.wait_for()
    page.wait_for_load_state("networkidle")
    expect(page.locator("[aria-busy=true]")).to_have_count(0)


def test_the_model_page_shows_card_facts_dtypes_files_and_variants(
    signed_in: Page, ui_server: Server, seed: Seed
) -> None:
    page = signed_in
    version = ui_server.api.get(f"/models/{seed.model_id}/versions/1").json()
    open_page(page, f"#/models/{seed.model_id}")

    facts = page.get_by_label("About this version")
    expect(facts.locator('[data-fact="Architecture"] dd')).to_have_text("GPT2LMHeadModel")
    params = version["parameter_count"]
    assert params and params > 0
    shown = facts.locator('[data-fact="Parameters"] dd').inner_text()
    assert re.fullmatch(r"[\d.]+[KMB]?", shown), shown
    unit = {"K": 1e3, "M": 1e6, "B": 1e9}.get(shown[-1], 1)
    assert abs(float(shown.rstrip("KMB")) * unit - params) / params < 0.01
    expect(facts.locator('[data-fact="Ready variants"] dd')).to_have_text("1")
    aliases = ui_server.api.get(f"/models/{seed.model_id}/aliases").json()["items"]
    on_one = sorted(a["alias"] for a in aliases if a["version"] == 1)
    assert "prod" in on_one
    expect(facts.locator('[data-fact="Aliases"] dd')).to_have_text(", ".join(on_one))

    # The card: Markdown rendered, its HTML shown as text and never run or loaded.
    card = page.get_by_role("article", name="Model card")
    expect(card.get_by_role("heading", name="Tiny GPT-2 for the page checks")).to_be_visible()
    expect(card.locator("strong")).to_have_text("small")
    expect(card.locator("table td").first).to_have_text("toy")
    expect(card.locator("li")).to_have_count(2)
    text = card.inner_text()
    assert "<script>window.__cardRan = true</script>" in text
    assert '<img src="x" onerror="window.__cardRan = true">' in text
    assert 'print("<b>not bold</b>")' in text
    assert card.locator("script, img, iframe, b, [onerror]").count() == 0
    assert card.locator('a[href^="javascript:"]').count() == 0
    link = card.get_by_role("link", name="link")
    assert link.get_attribute("href") == "https://example.invalid/docs"
    assert "noopener" in (link.get_attribute("rel") or "")
    assert page.evaluate("window.__cardRan === undefined")
    expect(page.locator(".card-meta")).to_contain_text("apache-2.0")

    # Tensors by dtype: the finalize report's numbers.
    breakdown = version["dtype_breakdown"]
    for dtype, counts in breakdown.items():
        row = page.locator(f'#dtypes-heading ~ * tr[data-dtype="{dtype}"]')
        expect(row).to_contain_text(f"{counts['parameters']:,}")
        expect(row.locator("td").first).to_have_text(f"{counts['tensors']:,}")

    # Files with human sizes and full sha256.
    files = page.locator("#files-heading ~ * tr[data-path]")
    expect(files).to_have_count(len(version["files"]))
    for f in version["files"]:
        row = page.locator(f'tr[data-path="{f["path"]}"]')
        expect(row.locator("code.sha256")).to_have_text(f["sha256"])
        assert row.locator("td").first.inner_text() == format_size(f["size"])

    # The variant matrix: dtype rows by format/TP/encryption columns with status.
    ready = page.locator('td[data-variant="bfloat16 hf · TP 1"]')
    expect(ready.locator(".badge")).to_have_text("ready")
    expect(page.locator('td[data-variant="float16 hf · TP 1"]')).to_contain_text("Make it")
    shot(page, "model-page")

    # Another version is one choice away; its facts follow.
    page.get_by_label("Shown version").select_option(str(seed.draft))
    expect(facts.locator('[data-fact="Version"] dd')).to_contain_text(f"{seed.draft} draft")
    expect(facts.locator('[data-fact="Parameters"] dd')).to_have_text("\u2013")


def test_custom_code_is_flagged_on_the_model_page(
    signed_in: Page, ui_server: Server, seed: Seed, tmp_path: Path
) -> None:
    """A version whose config maps classes to its own *.py (loading it needs
    --trust-remote-code) says so among its facts; a plain one says none (issue 36 §4)."""
    api = ui_server.api
    directory = make_tiny_gpt2(tmp_path / "fancy")
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_fancy.FancyForCausalLM"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "modeling_fancy.py").write_text("import os  # runs when loaded\n")
    name = f"acme/fancy-{secrets.token_hex(3)}"
    model = api.post("/models", json={"name": name}).json()
    publish(api, model["id"], directory, finalize=True)
    assert api.get(f"/models/{model['id']}/versions/1").json()["remote_code"]["files"] == [
        "modeling_fancy.py"
    ]

    open_page(signed_in, f"#/models/{model['id']}")
    fact = signed_in.get_by_label("About this version").locator('[data-fact="Remote code"] dd')
    notice = fact.locator("[data-remote-code=true]")
    expect(notice).to_have_text(
        "needs --trust-remote-code: auto_map AutoModelForCausalLM, modeling_fancy.py"
    )
    assert "trust-remote-code" in (notice.get_attribute("title") or "")
    shot(signed_in, "model-remote-code")

    open_page(signed_in, f"#/models/{seed.model_id}")
    plain = signed_in.get_by_label("About this version").locator('[data-fact="Remote code"] dd')
    expect(plain).to_have_text("none")
    expect(plain.locator("[data-remote-code]")).to_have_count(0)


def test_the_markdown_renderer_never_makes_markup_from_card_text(signed_in: Page) -> None:
    hostile = [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        "[x](javascript:alert(1))",
        "[x](  javascript:alert(1))",
        "[x](data:text/html,<script>alert(1)</script>)",
        "**<svg onload=alert(1)>**",
        "| a |\n|---|\n| <iframe src=x> |",
        "> <style>*{display:none}</style>",
        "`<b>` <b>bold</b>",
    ]
    tags = signed_in.evaluate(
        """async (cases) => {
          const { renderMarkdown } = await import('/ui/js/markdown.js');
          return cases.map((text) => {
            const box = document.createElement('div');
            box.append(...renderMarkdown(text));
            const hrefs = [...box.querySelectorAll('a')].map((a) => a.getAttribute('href'));
            const attrs = [...box.querySelectorAll('*')].flatMap((el) =>
              [...el.attributes].map((a) => a.name).filter((n) => n.startsWith('on')));
            const tags = [...new Set([...box.querySelectorAll('*')].map((el) => el.localName))];
            return { tags, hrefs, attrs, text: box.textContent };
          });
        }""",
        hostile,
    )
    allowed = {"p", "strong", "em", "code", "a", "span", "blockquote", "div", "table", "thead"}
    allowed |= {"tbody", "tr", "th", "td"}
    for case, got in zip(hostile, tags, strict=True):
        assert set(got["tags"]) <= allowed, (case, got["tags"])
        assert got["attrs"] == [], case
        assert all(h.startswith(("https://", "http://", "mailto:")) for h in got["hrefs"]), case
    assert "<script>alert(1)</script>" in tags[0]["text"]
    assert "<img src=x onerror=alert(1)>" in tags[1]["text"]
    assert "<b>bold</b>" in tags[8]["text"]


def test_deletes_ask_first_then_remove_alias_version_artifact_and_model(
    signed_in: Page, ui_server: Server, tmp_path: Path
) -> None:
    api = ui_server.api
    directory = make_tiny_gpt2(tmp_path / "doomed")
    config = json.loads((directory / "config.json").read_text())
    # Finalize accepts it; the worker cannot build it, so its artifact ends failed.
    config.update(architectures=["NoSuchModelForCausalLM"], model_type="no-such-model")
    (directory / "config.json").write_text(json.dumps(config))
    name = f"acme/doomed-{secrets.token_hex(3)}"
    model = api.post("/models", json={"name": name}).json()
    publish(api, model["id"], directory, finalize=True)
    draft = publish(api, model["id"], directory, finalize=False)
    assert api.put(f"/models/{model['id']}/aliases/canary", json={"version": 1}).status_code == 201
    job = api.post(f"/models/{model['id']}/tensorize", json={"dtype": "float32", "format": "hf"})
    assert job.status_code == 202, job.text
    assert wait_job_sync(api, job.json()["id"])["status"] == "failed"
    artifact_id = job.json()["artifact_id"]

    page = signed_in
    open_page(page, f"#/models/{model['id']}?version=1")

    # Alias: the first press only arms the button; Cancel disarms it.
    page.get_by_role("button", name="Delete alias canary").click()
    page.get_by_role("button", name="Cancel").click()
    assert api.get(f"/models/{model['id']}/aliases/canary").status_code == 200
    page.get_by_role("button", name="Delete alias canary").click()
    page.get_by_role("button", name="Confirm: delete alias canary").click()
    expect(page.locator('tr[data-alias="canary"]')).to_have_count(0)
    assert api.get(f"/models/{model['id']}/aliases/canary").status_code == 404
    aliases_fact = page.get_by_label("About this version").locator('[data-fact="Aliases"] dd')
    expect(aliases_fact).to_have_text("\u2013")
    history = api.get(f"/models/{model['id']}/aliases").json()
    assert history["items"] == []

    # Time left while a job runs: the bytes still to go at the rate so far.
    eta = page.evaluate(
        """async () => {
          const { jobEta } = await import('/ui/js/views/jobs.js');
          const started = new Date(Date.now() - 10_000).toISOString();
          return jobEta({ status: 'running', started_at: started, result: {},
                          progress: { bytes_done: 100, bytes_total: 300 } });
        }"""
    )
    assert 19 <= eta <= 21

    # The failed variant in the matrix.
    cell = page.locator('td[data-variant="float32 hf · TP 1"]')
    expect(cell.locator(".badge")).to_have_text("failed")
    shot(page, "model-delete-armed-before")
    cell.get_by_role("button", name=re.compile("^Delete artifact")).click()
    shot(page, "model-delete-armed")
    cell.get_by_role("button", name=re.compile("^Confirm: delete artifact")).click()
    expect(page.locator('td[data-variant="float32 hf · TP 1"]')).to_contain_text("Make it")
    assert api.get(f"/artifacts/{artifact_id}").status_code == 404

    # The draft version.
    page.get_by_role("button", name=f"Delete version {draft}").click()
    page.get_by_role("button", name=f"Confirm: delete version {draft}").click()
    expect(page.locator(f'tr[data-version="{draft}"]')).to_have_count(0)
    assert api.get(f"/models/{model['id']}/versions/{draft}").status_code == 404

    # The model: only once its name is typed.
    delete = page.get_by_role("button", name="Delete this model")
    expect(delete).to_be_disabled()
    page.get_by_label(f"Type {name} to confirm").fill("acme/wrong")
    expect(delete).to_be_disabled()
    page.get_by_label(f"Type {name} to confirm").fill(name)
    delete.click()
    page.get_by_role("heading", level=1, name="Models").wait_for()
    assert api.get(f"/models/{model['id']}").status_code == 404


def test_the_models_list_shows_latest_version_aliases_variants_and_size(
    signed_in: Page, ui_server: Server, seed: Seed
) -> None:
    summary = ui_server.api.get(f"/models/{seed.model_id}").json()["summary"]
    page = signed_in
    open_page(page, f"#/models?q={seed.name}")
    row = page.locator(f'tr[data-model="{seed.name}"]')
    expect(row.locator('[data-cell="latest"]')).to_have_text(f"v1 of {summary['version_count']}")
    assert summary["aliases"]["prod"] == 1
    expect(row.locator('[data-cell="aliases"]')).to_have_text(
        ", ".join(f"{a} → v{v}" for a, v in summary["aliases"].items())
    )
    expect(row.locator('[data-cell="variants"]')).to_have_text("1")
    assert re.fullmatch(r"[\d.]+ (kB|MB)", row.locator('[data-cell="size"]').inner_text())
    shot(page, "models-list")


def test_the_jobs_page_filters_lives_and_shows_throughput(
    signed_in: Page, ui_server: Server, seed: Seed
) -> None:
    page = signed_in
    open_page(page, "#/jobs")
    page.get_by_label("Kind").select_option("tensorize")
    page.get_by_label("Status").select_option("succeeded")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"#/jobs\?kind=tensorize&status=succeeded$"))
    row = page.locator(f'tr[data-job="{seed.job_id}"]')
    expect(row).to_contain_text(seed.name)
    rate = ui_server.api.get(f"/jobs/{seed.job_id}").json()["result"]["bytes_per_second"]
    assert rate > 0
    expect(row.locator('[data-cell="throughput"]')).to_have_text(RATE)
    expect(row.locator('[data-cell="time"]')).to_contain_text("took")
    # What the job made, and where: the job's typed variant, read from its artifact row.
    variant = ui_server.api.get(f"/jobs/{seed.job_id}").json()["variant"]
    assert (variant["version"], variant["dtype"], variant["storage"]) == (1, "bfloat16", "local")
    expect(row.locator('[data-cell="makes"]')).to_have_text("v1 bfloat16 · hf · TP 1")
    expect(row.locator('[data-cell="storage"]')).to_have_text("local")
    # The page reads that typed field, never the deprecated copy in params.
    shown = page.evaluate(
        """async () => {
          const { jobMakes } = await import('/ui/js/views/jobs.js');
          const { throughputChart } = await import('/ui/js/views/activity.js');
          const variant = { version: 3, dtype: 'float32', format: 'vllm',
            tensor_parallel_size: 2, encrypted: true, storage: 's3' };
          const stale = { dtype: 'float16', format: 'hf', version: 1 };
          const at = '2026-12-06T14:30:05Z';
          const chart = throughputChart([{ id: 'a', kind: 'tensorize', status: 'succeeded',
            started_at: at, finished_at: at, result: { bytes_per_second: 1e6 }, variant,
            params: stale }]);
          return { makes: jobMakes({ variant, params: stale }), none: jobMakes({ params: stale }),
            bar: chart.querySelector('svg title').textContent };
        }"""
    )
    assert shown["makes"] == "v3 float32 · vllm · TP 2 · encrypted"
    assert shown["none"] == "\u2013"  # an en dash: nothing made
    assert "float32" in shown["bar"] and "float16" not in shown["bar"], shown["bar"]
    statuses = page.locator("tr[data-job]").evaluate_all("rows => rows.map(r => r.dataset.status)")
    assert set(statuses) == {"succeeded"}
    assert page.locator("svg.chart rect").count() >= 1
    shot(page, "jobs-filtered")

    # Live: a job started while the page is open appears and finishes there, without a reload.
    open_page(page, "#/jobs?kind=import")
    source = make_tiny_gpt2(ui_server.import_root / f"live-{secrets.token_hex(3)}")
    target = ui_server.api.post("/models", json={"name": f"acme/live-{secrets.token_hex(3)}"})
    r = ui_server.api.post(
        f"/models/{target.json()['id']}/versions", json={"source_uri": source.as_uri() + "/"}
    )
    assert r.status_code in (201, 202), r.text
    new_row = page.locator(f'tr[data-job="{r.json()["job_id"]}"]')
    expect(new_row).to_have_attribute("data-status", "succeeded", timeout=60_000)
    shot(page, "jobs-live")

    # The job's own page shows the recorded throughput once finished (it showed a dash).
    open_page(page, f"#/jobs/{seed.job_id}")
    expect(page.locator('[data-prop="Throughput"]')).to_have_text(RATE)
    expect(page.locator('[data-prop="Makes"]')).to_have_text("v1 bfloat16 · hf · TP 1")
    expect(page.locator('[data-prop="Storage"]')).to_have_text("local")


def test_the_audit_page_is_a_readable_filterable_table(signed_in: Page, seed: Seed) -> None:
    page = signed_in
    open_page(page, "#/audit")
    page.get_by_label("Action").fill("resolve")
    page.get_by_label("Model").fill(seed.name)
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(3)
    texts = rows.all_inner_texts()
    assert all("Resolved" in t and "to version 1" in t for t in texts)
    assert any("Resolved prod to version 1" in t for t in texts)
    assert all('{"' not in t for t in texts), texts
    assert all("ui-seed" in t for t in texts)  # the node named in the resolve
    shot(page, "audit-table")
    # An action is a link that filters by it.
    rows.first.get_by_role("link", name="resolve", exact=True).click()
    expect(page).to_have_url(re.compile(r"#/audit\?action=resolve"))


def test_the_activity_page_draws_resolves_per_model_and_job_throughput(
    signed_in: Page, seed: Seed
) -> None:
    page = signed_in
    open_page(page, "#/activity")
    resolves = page.locator('[data-chart="resolve"] svg.chart')
    expect(resolves).to_have_count(1)
    line = resolves.locator(f'g[data-series="{seed.name}"]')
    expect(line.locator("polyline")).to_have_count(1)
    # The three seed resolves fall in today's bucket.
    assert line.locator("circle").count() >= 1
    assert seed.name in (resolves.get_attribute("aria-label") or "")
    assert page.locator("svg.chart rect").count() >= 1
    page.get_by_label("Time range").select_option("24h")
    expect(page).to_have_url(re.compile(r"range=24h"))
    expect(page.locator('[data-chart="resolve"] svg.chart')).to_have_count(1)
    shot(page, "activity")
    # And on the model page, for admins.
    open_page(page, f"#/models/{seed.model_id}")
    expect(page.locator(f'#activity-heading ~ * g[data-series="{seed.name}"]')).to_have_count(1)
