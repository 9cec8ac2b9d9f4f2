"""End to end in Chromium against a real `tensor-registry serve`: sign in, create a model, upload a
Hugging Face folder (a broken file first, then a failed transfer that is resumed), finalize,
tensorize and watch the job succeed, copy the vLLM command, move an alias through a 412
conflict, and find the move in the audit log.

The steps run in order on one page and share state; a step whose predecessor failed fails too,
naming it. A route this server lacks (404 `not_found`) is a failure, never a skip.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from harness.waiting import wait_live_worker_sync
from tests.hf_fixtures import make_tiny_gpt2
from tests.ui.conftest import Server, close_page, new_page, open_view, shot, sign_in

try:
    from playwright.sync_api import expect
except ImportError:  # the conftest skips these tests without Playwright
    expect = None

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page, Route

pytestmark = pytest.mark.browser

JOB_TIMEOUT_MS = 120_000


@dataclass
class Flow:
    page: Page
    server: Server
    name: str = field(default_factory=lambda: f"acme/tiny-gpt2-{secrets.token_hex(3)}")
    model_id: str | None = None
    version_ready: bool = False
    artifact_ready: bool = False
    alias_moved: bool = False

    def need(self, attr: str, step: str) -> None:
        if not getattr(self, attr):
            pytest.fail(f"needs the outcome of {step}, which did not complete")


@pytest.fixture(scope="module")
def flow(browser: Browser, ui_server: Server) -> Iterator[Flow]:
    page = new_page(browser, ui_server)
    yield Flow(page=page, server=ui_server)
    close_page(page)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gpt2(tmp_path_factory.mktemp("hf") / "tiny-gpt2")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def require_route(response: httpx.Response, what: str) -> None:
    assert not (response.status_code == 404 and response.json().get("code") == "not_found"), (
        f"{what} is missing on this server ({response.request.method} "
        f"{response.request.url.path} → 404 no such route)"
    )


def row(page: Page, path: str) -> Locator:
    return page.locator(f'tr[data-path="{path}"]')


def points_at(page: Page, alias: str) -> Locator:
    return page.locator(f'tr[data-alias="{alias}"] td.points-at')


def test_sign_in_keeps_the_token_out_of_urls(flow: Flow) -> None:
    page = flow.page
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    page.goto("/")
    page.get_by_role("heading", level=1, name="Sign in").wait_for()
    shot(page, "01-sign-in")

    page.get_by_label("API token").fill("trg_not-a-real-token-000000000000")
    page.keyboard.press("Enter")
    error = page.locator(".field-error")
    error.wait_for()
    assert "unknown, revoked or expired" in error.inner_text()

    sign_in(page, flow.server.token)
    assert page.evaluate("sessionStorage.getItem('tensor-registry.token')") == flow.server.token
    assert page.evaluate("localStorage.length") == 0
    who = flow.server.api.get("/tokens/self").json()
    assert page.locator("#whoami").inner_text() == f"Signed in as {who['name']} (admin)"
    assert not [u for u in urls if flow.server.token in u], "the token appeared in a URL"
    shot(page, "02-models-empty")


def test_create_model(flow: Flow) -> None:
    page = flow.page
    open_view(page, "/#/models")
    page.get_by_label("Name", exact=True).fill("Not A Valid Name")
    page.get_by_role("button", name="Create model").click()
    invalid = page.locator('[aria-invalid="true"]')
    invalid.wait_for()
    assert invalid.get_attribute("name") == "name"

    page.get_by_label("Name", exact=True).fill(flow.name)
    page.get_by_label("Description", exact=True).fill("A tiny GPT-2 published from the browser.")
    page.get_by_label("Tags", exact=True).last.fill("tiny, gpt2")
    page.get_by_role("button", name="Create model").click()
    page.get_by_role("heading", level=1, name=flow.name).wait_for()
    flow.model_id = page.url.rsplit("/", 1)[1]

    r = flow.server.api.get(f"/models/{flow.model_id}")
    assert r.status_code == 200
    assert r.json()["name"] == flow.name and r.json()["tags"] == ["gpt2", "tiny"]
    assert r.json()["description"] == "A tiny GPT-2 published from the browser."
    shot(page, "03-model-created")


def test_upload_folder_shows_problems_resumes_and_finalizes(
    flow: Flow, model_dir: Path, tmp_path: Path
) -> None:
    flow.need("model_id", "test_create_model")
    page = flow.page
    page.get_by_role("link", name="Publish a version").click()
    page.get_by_role("button", name="Start a new draft version").click()
    page.get_by_role("heading", level=1, name=f"Publish version 1 of {flow.name}").wait_for()

    # 1. A config and a broken weights file: both upload, finalize names the broken one.
    broken = b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\x00" * 64
    (tmp_path / "model.safetensors").write_bytes(broken)
    page.locator("#files-input").set_input_files(
        [str(model_dir / "config.json"), str(tmp_path / "model.safetensors")]
    )
    page.get_by_role("button", name="Upload 2 files").click()
    for path in ("config.json", "model.safetensors"):
        row(page, path).locator(".status").filter(has_text="Uploaded").wait_for()
    assert row(page, "config.json").locator("code.hash").get_attribute("title") == sha256(
        model_dir / "config.json"
    )
    assert row(page, "model.safetensors").locator("code.hash").get_attribute("title") == (
        hashlib.sha256(broken).hexdigest()
    )
    page.get_by_role("button", name="Finalize version 1").click()
    alert = page.locator(".problem[role=alert]")
    alert.wait_for()
    assert "cannot be finalized" in alert.inner_text()
    assert "corrupt_weights" in row(page, "model.safetensors").locator(".problems").inner_text()
    assert row(page, "config.json").locator(".problems").inner_text() == ""
    shot(page, "04-finalize-problems")

    # 2. The whole folder; one transfer dies on the way and is retried alone.
    failed_once: list[str] = []

    def drop_first_tokenizer_upload(route: Route) -> None:
        if route.request.method == "PUT" and not failed_once:
            failed_once.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route("**/files/tokenizer.json", drop_first_tokenizer_upload)
    page.locator("#folder-input").set_input_files(str(model_dir))
    expected = sorted(p.name for p in model_dir.iterdir() if p.is_file())
    for name in expected:
        row(page, name).wait_for()
    page.get_by_role("button", name=f"Upload {len(expected)} files").click()
    summary = page.locator(".summary")
    summary.filter(has_text="failed").wait_for()
    assert failed_once, "the tokenizer upload was not attempted"
    failed = row(page, "tokenizer.json").locator(".status").inner_text()
    assert failed.startswith("failed") and "network_error" in failed
    # Same path, size and sha256 as already in the draft: not sent again.
    assert "Already in the draft" in row(page, "config.json").locator(".status").inner_text()
    shot(page, "05-upload-one-failed")

    page.unroute("**/files/tokenizer.json")
    page.get_by_role("button", name="Upload 1 file").click()
    row(page, "tokenizer.json").locator(".status").filter(has_text="Uploaded").wait_for()
    assert page.locator("#total-text").inner_text().endswith("(100%)")
    for name in expected:
        assert row(page, name).locator("code.hash").get_attribute("title") == sha256(
            model_dir / name
        ), name
    shot(page, "06-upload-done")

    page.get_by_role("button", name="Finalize version 1").click()
    page.get_by_text("Version 1 is ready").wait_for()
    shot(page, "07-finalized")

    version = flow.server.api.get(f"/models/{flow.model_id}/versions/1").json()
    assert version["status"] == "ready"
    assert {f["path"]: f["sha256"] for f in version["files"]} == {
        name: sha256(model_dir / name) for name in expected
    }
    flow.version_ready = True


def test_tensorize_and_watch_the_job_succeed(flow: Flow) -> None:
    flow.need("version_ready", "test_upload_folder_shows_problems_resumes_and_finalizes")
    page = flow.page
    require_route(
        flow.server.api.post(f"/models/{flow.model_id}/tensorize", json={}),
        "POST /api/v1/models/{id}/tensorize",
    )
    require_route(flow.server.api.get("/workers"), "GET /api/v1/workers")
    wait_live_worker_sync(
        flow.server.api, timeout=90, detail=lambda: "\n".join(flow.server.process.lines[-40:])
    )
    page.get_by_role("link", name="Tensorize it").click()
    page.get_by_role("heading", level=1, name=f"Tensorize {flow.name}").wait_for()

    # Only what the live workers can run: no vLLM here, so no vllm format and no TP > 1.
    page.get_by_role("button", name="Start tensorize job").wait_for()
    workers = flow.server.api.get("/workers").json()["items"]
    formats = sorted({f for w in workers for f in w["capabilities"].get("formats", [])})
    offered = (
        page.get_by_label("Format")
        .locator("option")
        .evaluate_all("options => options.map(o => o.value)")
    )
    assert sorted(offered) == formats
    if "vllm" not in formats:
        tp = page.get_by_label("Tensor-parallel size").locator("option").all_inner_texts()
        assert tp == ["1"]
    # Only the storage backends the server has configured (embedded default: local).
    storage = flow.server.api.get("/storage").json()
    stores = (
        page.get_by_label("Storage")
        .locator("option")
        .evaluate_all("options => options.map(o => o.value)")
    )
    assert stores == ["", *storage["configured"]] == ["", "local"]
    page.get_by_label("Dtype").select_option("float16")
    page.get_by_label("Format").select_option("hf")
    shot(page, "08-tensorize-form")
    # The job view follows the job over server-sent events (fetch + bearer header).
    with page.expect_request("**/api/v1/jobs/*/events") as events:
        page.get_by_role("button", name="Start tensorize job").click()
    assert events.value.headers["authorization"] == f"Bearer {flow.server.token}"
    page.get_by_role("heading", level=1, name="Tensorize job").wait_for()
    status = page.locator(".job-status")
    assert status.get_attribute("aria-live") == "polite"
    shot(page, "09-job-running")
    try:
        status.filter(has_text="succeeded").wait_for(timeout=JOB_TIMEOUT_MS)
    except Exception:
        shot(page, "09-job-not-succeeded")
        log = "\n".join(flow.server.process.lines[-60:])
        raise AssertionError(
            f"the job did not succeed: {page.locator('main').inner_text()}\nserver log:\n{log}"
        ) from None
    assert page.locator('[data-prop="Stage"]').inner_text() != ""
    shot(page, "10-job-succeeded")
    flow.artifact_ready = True


def test_copy_the_vllm_command(flow: Flow) -> None:
    flow.need("artifact_ready", "test_tensorize_and_watch_the_job_succeed")
    require_route(
        flow.server.api.get(f"/models/{flow.model_id}/artifacts"),
        "GET /api/v1/models/{id}/artifacts",
    )
    require_route(
        flow.server.api.get("/resolve", params={"model": flow.name}), "GET /api/v1/resolve"
    )
    page = flow.page
    page.get_by_role("link", name="Serve it: open the model").click()
    card = page.locator("article.artifact").filter(has_text="float16")
    card.wait_for()
    assert "ready" in card.inner_text()
    card.get_by_role("button", name="Show the vllm serve command").click()
    card.get_by_role("button", name="Copy vllm serve command").click()
    card.get_by_text("Copied").wait_for()
    command = page.evaluate("navigator.clipboard.readText()")
    shot(page, "11-serve-it")

    words = shlex.split(command)
    assert words[:2] == ["vllm", "serve"]
    assert words[words.index("--load-format") + 1] == "tensorizer"
    assert words[words.index("--dtype") + 1] == "float16"
    extra = json.loads(words[words.index("--model-loader-extra-config") + 1])
    # The copied command must work: its signed URL serves the artifact's bytes.
    head = httpx.head(extra["tensorizer_uri"], timeout=30)
    assert head.status_code == 200
    artifact = flow.server.api.get(f"/models/{flow.model_id}/artifacts").json()["items"][0]
    weights = next(f for f in artifact["files"] if f["path"] == "model.tensors")
    assert int(head.headers["content-length"]) == weights["size"]
    ranged = httpx.get(extra["tensorizer_uri"], headers={"Range": "bytes=0-7"}, timeout=30)
    assert ranged.status_code == 206 and len(ranged.content) == 8

    # The resolve snippet and the pull command are there to copy as well.
    card.get_by_role("button", name="Copy resolve request").click()
    resolve = shlex.split(page.evaluate("navigator.clipboard.readText()"))
    r = httpx.get(resolve[-1], headers={"Authorization": f"Bearer {flow.server.token}"})
    assert r.status_code == 200 and r.json()["artifact"]["id"] == artifact["id"]
    card.get_by_role("button", name="Copy pull command").click()
    pull = page.evaluate("navigator.clipboard.readText()")
    assert pull.startswith(f"tensor-registry pull {flow.name}:1 ")


def publish_via_api(server: Server, model_id: str, directory: Path) -> int:
    version = server.api.post(f"/models/{model_id}/versions", json={}).json()["version"]
    for path in sorted(directory.iterdir()):
        r = server.api.put(
            f"/models/{model_id}/versions/{version}/files/{path.name}",
            content=path.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 201, r.text
    assert server.api.post(f"/models/{model_id}/versions/{version}/finalize").status_code == 200
    return int(version)


def test_move_an_alias_through_a_conflict(flow: Flow, model_dir: Path) -> None:
    flow.need("version_ready", "test_upload_folder_shows_problems_resumes_and_finalizes")
    page = flow.page
    second = publish_via_api(flow.server, flow.model_id, model_dir)  # type: ignore[arg-type]
    open_view(page, f"/#/models/{flow.model_id}")
    aliases = page.locator("section.aliases")
    aliases.get_by_label("Alias", exact=True).fill("prod")
    aliases.get_by_label("Version").select_option("1")
    aliases.get_by_role("button", name="Move alias").click()
    expect(points_at(page, "prod")).to_have_text("version 1")

    # Someone else moves prod while this page still shows version 1 …
    r = flow.server.api.put(f"/models/{flow.model_id}/aliases/prod", json={"version": second})
    assert r.status_code == 200
    # … so this move, made on a stale ETag, is refused (412) and explained, not applied.
    aliases.get_by_label("Alias", exact=True).fill("prod")
    aliases.get_by_label("Version").select_option("1")
    aliases.get_by_role("button", name="Move alias").click()
    conflict = aliases.locator(".problem[role=alert]")
    conflict.wait_for()
    assert f"moved to version {second}" in conflict.inner_text()
    assert flow.server.api.get(f"/models/{flow.model_id}/aliases/prod").json()["version"] == second
    expect(points_at(page, "prod")).to_have_text(f"version {second}")
    shot(page, "12-alias-conflict")

    aliases.get_by_role("button", name="Move prod to version 1 anyway").click()
    expect(points_at(page, "prod")).to_have_text("version 1")
    prod = flow.server.api.get(f"/models/{flow.model_id}/aliases/prod").json()
    assert prod["version"] == 1
    assert [(e["from_version"], e["to_version"]) for e in prod["history"]][-3:] in (
        [(None, 1), (1, second), (second, 1)],
        [(second, 1), (1, second), (None, 1)],
    )
    aliases.get_by_text("History (3)").click()
    shot(page, "13-alias-moved")
    flow.alias_moved = True


def test_the_audit_log_shows_the_alias_moves(flow: Flow) -> None:
    flow.need("alias_moved", "test_move_an_alias_through_a_conflict")
    page = flow.page
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Audit").click()
    page.get_by_role("heading", level=1, name="Audit log").wait_for()
    page.get_by_label("Action").fill("alias.set")
    page.get_by_label("Model").fill(flow.name)
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("tbody tr")
    rows.first.wait_for()
    expect(rows).to_have_count(3)
    newest = rows.first.inner_text()
    assert "alias.set" in newest and flow.name in newest
    # A sentence, not raw JSON.
    assert "to version 1" in newest and '{"' not in newest
    shot(page, "14-audit")
