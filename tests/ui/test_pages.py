"""Every page of the UI in Chromium: accessible names (from Chromium's own accessibility tree),
text contrast, keyboard use, phone width without horizontal scrolling, no request off this
server, plus tokens, workers, permissions and the browser-side sha256 and drop zone.

The pages are filled by a model seeded through the API (a ready version, a draft, an alias and,
where the server can tensorize, an artifact), so tables and cards are on screen when checked.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from harness.waiting import wait_live_worker_sync
from tests.hf_fixtures import make_tiny_gpt2
from tests.ui.conftest import Seed, Server, close_page, new_page, publish, shot, sign_in

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect
except ImportError:  # the conftest skips these tests without Playwright
    expect = None
    PlaywrightTimeout = TimeoutError

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.browser

# Roles that a user operates or reads as a control: each needs an accessible name.
NAMED_ROLES = {
    "button",
    "link",
    "textbox",
    "searchbox",
    "combobox",
    "checkbox",
    "radio",
    "listbox",
    "spinbutton",
    "slider",
    "progressbar",
    "switch",
    "menuitem",
    "tab",
}


def pages(seed: Seed) -> list[tuple[str, str]]:
    out = [
        ("models", "#/models"),
        ("model", f"#/models/{seed.model_id}"),
        ("publish", f"#/models/{seed.model_id}/publish"),
        ("upload", f"#/models/{seed.model_id}/publish/{seed.draft}"),
        ("tensorize", f"#/models/{seed.model_id}/tensorize"),
        ("tokens", "#/tokens"),
        ("workers", "#/workers"),
        ("nodes", "#/nodes?stale=1"),
        ("audit", "#/audit"),
        ("limits", "#/limits"),
        ("job", f"#/jobs/{seed.job_id}"),
        ("jobs", "#/jobs"),
        ("activity", "#/activity"),
    ]
    return out


def open_page(page: Page, url: str) -> None:
    page.goto(f"/{url}")
    page.locator("main h1").first.wait_for()
    page.wait_for_load_state("networkidle")
    # (No wait_for_function: its string predicates are eval()ed, which the UI's CSP forbids.)
    expect(page.locator("[aria-busy=true]")).to_have_count(0)


def unnamed_controls(page: Page) -> list[str]:
    cdp = page.context.new_cdp_session(page)
    try:
        tree = cdp.send("Accessibility.getFullAXTree")
    finally:
        cdp.detach()
    missing = []
    for node in tree["nodes"]:
        role = (node.get("role") or {}).get("value")
        if node.get("ignored") or role not in NAMED_ROLES:
            continue
        if not str((node.get("name") or {}).get("value") or "").strip():
            missing.append(f"{role} (backend node {node.get('backendDOMNodeId')})")
    return missing


CONTRAST_JS = (Path(__file__).parent / "contrast.js").read_text()


def test_every_page_names_its_controls_meets_contrast_and_stays_on_this_server(
    signed_in: Page, seed: Seed, ui_server: Server
) -> None:
    page = signed_in
    hosts: set[str] = set()
    page.on("request", lambda request: hosts.add(httpx.URL(request.url).host))
    for name, url in pages(seed):
        open_page(page, url)
        shot(page, f"laptop-{name}")
        assert unnamed_controls(page) == [], f"controls without a name on {name}"
        assert page.evaluate(CONTRAST_JS) == [], f"low contrast on {name}"
        assert page.locator("main h1").count() == 1, f"{name} needs exactly one h1"
        assert page.locator("[onclick], div[role=button], span[role=button]").count() == 0
    assert hosts == {"127.0.0.1"}
    # The server backs this up for browsers: a CSP that only allows this origin.
    csp = httpx.get(f"{ui_server.url}/").headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp


def test_sign_in_page_is_accessible(page: Page) -> None:
    page.goto("/")
    page.get_by_role("heading", name="Sign in").wait_for()
    assert unnamed_controls(page) == []
    assert page.evaluate(CONTRAST_JS) == []


def test_keyboard_only_sign_in_and_navigation(page: Page, ui_server: Server, seed: Seed) -> None:
    page.goto("/")
    page.get_by_role("heading", name="Sign in").wait_for()
    # The token field has focus on arrival; Enter submits.
    assert page.evaluate("document.activeElement.name") == "token"
    page.keyboard.type(ui_server.token)
    page.keyboard.press("Enter")
    page.get_by_role("heading", level=1, name="Models").wait_for()
    # Focus moves to the new page's heading, so screen readers announce it.
    expect(page.locator("main h1")).to_be_focused()

    # On a fresh load the skip link is the first stop, and it jumps to the content.
    page.reload()
    page.get_by_role("heading", level=1, name="Models").wait_for()
    page.wait_for_load_state("networkidle")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "skip-link"
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "focus must be visible"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"

    # Tab to the seeded model's link and open it with Enter.
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == seed.name:
            break
    else:
        pytest.fail("the model link is not reachable with Tab")
    focus = page.evaluate(
        "(() => { const s = getComputedStyle(document.activeElement);"
        " return [s.outlineStyle, parseFloat(s.outlineWidth)]; })()"
    )
    assert focus[0] != "none" and focus[1] >= 2
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1, name=seed.name)).to_be_focused()

    # Move an alias with the keyboard alone.
    page.get_by_label("Alias", exact=True).focus()
    page.keyboard.type("staging")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.name") == "version"
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.locator('tr[data-alias="staging"]').wait_for()
    assert ui_server.api.get(f"/models/{seed.model_id}/aliases/staging").json()["version"] == 1


def test_phone_width_has_no_horizontal_overflow(
    browser: Browser, ui_server: Server, seed: Seed
) -> None:
    page = new_page(browser, ui_server, width=375, height=812)
    try:
        sign_in(page, ui_server.token)
        for name, url in pages(seed):
            open_page(page, url)
            shot(page, f"phone-{name}")
            assert_fits_a_phone(page, name)
    finally:
        close_page(page)


def assert_fits_a_phone(page: Page, name: str) -> None:
    """The page, opened at a phone's width, neither scrolls sideways nor cuts a table off."""
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"{name} scrolls sideways by {overflow}px at 375px"
    # Nor may a table hide columns in its own scroll box: tables reflow into cards.
    cut = page.evaluate(
        """() => [...document.querySelectorAll('main table')]
          .filter((t) => t.getBoundingClientRect().width > 0)
          .filter((t) => t.closest('.table-wrap').scrollWidth
                         > t.closest('.table-wrap').clientWidth + 1)
          .map((t) => t.querySelector('caption')?.textContent
                      ?? t.closest('.table-wrap').getAttribute('aria-label'))"""
    )
    assert cut == [], f"{name}: tables cut off at 375px: {cut}"


def test_tokens_secret_is_shown_once_and_revoke_works(signed_in: Page, ui_server: Server) -> None:
    page = signed_in
    page.goto("/#/tokens")
    page.get_by_role("heading", level=1, name="API tokens").wait_for()
    page.get_by_label("Name", exact=True).fill("rollout-bot")
    page.get_by_label("resolve", exact=False).first.check()
    page.get_by_label("Namespaces").fill("acme")
    page.get_by_label("Expires").select_option(label="30 days")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#new-token").inner_text().strip()
    assert secret.startswith("trg_")
    shot(page, "tokens-secret-once")

    who = httpx.get(
        f"{ui_server.url}/api/v1/tokens/self", headers={"Authorization": f"Bearer {secret}"}
    ).json()
    assert who["name"] == "rollout-bot"
    assert who["scopes"] == ["models:read", "resolve"] and who["namespaces"] == ["acme"]
    assert who["expires_at"] is not None

    page.get_by_role("button", name="I have stored it").click()
    assert secret not in page.content()
    page.reload()
    page.get_by_role("heading", level=1, name="API tokens").wait_for()
    assert secret not in page.content()

    row = page.locator("tbody tr").filter(has_text="rollout-bot")
    row.get_by_role("button", name="Revoke rollout-bot").click()
    row.get_by_role("button", name="Confirm: revoke rollout-bot").click()
    page.locator("tbody tr").filter(has_text="rollout-bot").locator(".badge-revoked").wait_for()
    r = httpx.get(
        f"{ui_server.url}/api/v1/tokens/self", headers={"Authorization": f"Bearer {secret}"}
    )
    assert r.status_code == 401


def test_a_read_only_token_sees_no_write_or_admin_actions(
    browser: Browser, ui_server: Server, seed: Seed
) -> None:
    created = ui_server.api.post("/tokens", json={"name": "reader", "scopes": ["models:read"]})
    token = created.json()["token"]
    page = new_page(browser, ui_server)
    try:
        sign_in(page, token)
        nav = page.get_by_role("navigation", name="Main")
        assert nav.get_by_role("link", name="Audit").count() == 0
        assert page.get_by_role("button", name="Create model").count() == 0
        assert "null" not in page.locator("main").inner_text()
        page.goto(f"/#/models/{seed.model_id}")
        page.get_by_role("heading", level=1, name=seed.name).wait_for()
        assert page.get_by_role("link", name="Publish a version").count() == 0
        assert page.get_by_role("button", name="Move alias").count() == 0
        page.goto("/#/audit")
        problem = page.locator(".problem[role=alert]")
        problem.wait_for()
        assert "insufficient_scope" in problem.inner_text()

        page.get_by_role("button", name="Sign out").click()
        page.get_by_role("heading", level=1, name="Sign in").wait_for()
        assert page.evaluate("sessionStorage.length") == 0
    finally:
        close_page(page)


def test_workers_page_lists_the_live_worker(signed_in: Page, ui_server: Server) -> None:
    r = ui_server.api.get("/workers")
    assert r.status_code == 200, r.text
    worker = wait_live_worker_sync(ui_server.api, timeout=90)[0]
    page = signed_in
    page.goto("/#/workers")
    card = page.get_by_role("article", name=f"Worker {worker['hostname']}")
    card.wait_for()
    text = card.inner_text()
    assert worker["id"] in text and "live" in text
    assert worker["capabilities"]["versions"]["tensorizer"] in text


def test_sha256_in_the_browser_matches_hashlib(page: Page) -> None:
    page.goto("/ui/")
    lengths = [0, 1, 55, 56, 63, 64, 65, 1000, 100_003]
    got = page.evaluate(
        """async (lengths) => {
          const { Sha256, sha256File } = await import('/ui/js/sha256.js');
          const bytes = (n) => Uint8Array.from({ length: n }, (_, i) => (i * 31 + 7) & 255);
          const out = {};
          for (const n of lengths) {
            const h = new Sha256(); const b = bytes(n);
            for (let i = 0; i < n; i += 777) h.update(b.subarray(i, i + 777));
            out[n] = h.hex();
          }
          // Above 64 MiB sha256File takes the incremental path, in 4 MiB slices.
          const big = new Uint8Array(65 * 1024 * 1024 + 5); big.fill(0x5a);
          out.big = await sha256File(new Blob([big]));
          return out;
        }""",
        lengths,
    )
    for n in lengths:
        data = bytes((i * 31 + 7) & 255 for i in range(n))
        assert got[str(n)] == hashlib.sha256(data).hexdigest(), n
    assert got["big"] == hashlib.sha256(b"\x5a" * (65 * 1024 * 1024 + 5)).hexdigest()


def test_files_dropped_on_the_drop_zone_are_listed(signed_in: Page, seed: Seed) -> None:
    page = signed_in
    open_page(page, f"#/models/{seed.model_id}/publish/{seed.draft}")
    page.evaluate(
        """() => {
          const dt = new DataTransfer();
          dt.items.add(new File(['{"architectures": []}'], 'extra.json'));
          dt.items.add(new File(['junk'], 'pytorch_model.bin'));
          const zone = document.getElementById('dropzone');
          const init = { dataTransfer: dt, bubbles: true, cancelable: true };
          zone.dispatchEvent(new DragEvent('dragover', init));
          zone.dispatchEvent(new DragEvent('drop', init));
        }"""
    )
    page.locator('tr[data-path="extra.json"]').wait_for()
    assert page.locator('tr[data-path="pytorch_model.bin"]').count() == 0
    assert "pytorch_model.bin" in page.locator(".upload .hint").first.inner_text()
    assert page.get_by_role("button", name="Upload 1 file").is_enabled()

    # Folder drops: the shared top folder is dropped, hidden files and other weight formats
    # are left out.
    kept = page.evaluate(
        """async () => {
          const { normalizePaths } = await import('/ui/js/views/upload.js');
          return normalizePaths([
            { path: '/tiny/config.json' }, { path: '/tiny/.git/HEAD' },
            { path: '/tiny/pytorch_model.bin' }, { path: '/tiny/sub/vocab.json' },
          ]);
        }"""
    )
    assert [k["path"] for k in kept["kept"]] == ["config.json", "sub/vocab.json"]
    assert kept["skipped"] == [".git/HEAD", "pytorch_model.bin"]


def test_import_from_a_source_uri_then_cancel(signed_in: Page, ui_server: Server) -> None:
    page = signed_in
    source = make_tiny_gpt2(ui_server.import_root / f"gpt2-{secrets.token_hex(3)}")
    # A model of its own: an import that finishes adds a version, and the seed's pages are
    # checked for exactly what the seed holds (other files may run first, in any order).
    model = ui_server.api.post("/models", json={"name": f"acme/import-{secrets.token_hex(3)}"})
    assert model.status_code == 201, model.text
    model_id = model.json()["id"]
    open_page(page, f"#/models/{model_id}/publish")
    uri = page.get_by_label("Source URI")
    uri.fill("ftp://example.invalid/model/")
    page.get_by_role("button", name="Import").click()
    expect(uri).to_have_attribute("aria-invalid", "true")
    expect(page.locator(".field-error:visible")).to_contain_text("must start with one of")

    uri.fill(source.as_uri() + "/")
    page.get_by_role("button", name="Import").click()
    page.get_by_role("heading", level=1, name="Import job").wait_for()
    job_id = page.url.rsplit("/", 1)[1]
    job = ui_server.api.get(f"/jobs/{job_id}").json()
    assert job["kind"] == "import" and job["model_id"] == model_id
    status = page.locator(".job-status")
    cancel = page.get_by_role("button", name="Cancel job")
    # The embedded worker may finish the import between any two steps here, and the page then
    # hides the button: click while it shows, else the job must already have ended.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ui_server.api.get(f"/jobs/{job_id}").json()["status"] not in {"queued", "running"}:
            break
        try:
            cancel.click(timeout=1_000)
            break
        except PlaywrightTimeout:
            continue
    # Cancelled before a worker finished it, or finished first (then cancelling says so).
    expect(status).to_contain_text(re.compile("cancelled|succeeded|failed"), timeout=60_000)
    final = ui_server.api.get(f"/jobs/{job_id}").json()["status"]
    expect(status).to_contain_text(final)
    if final == "cancelled":
        expect(page.get_by_text("The job was cancelled.")).to_be_visible()
        assert page.get_by_role("button", name="Cancel job").is_hidden()
    shot(page, f"import-job-{final}")


def test_editing_details_handles_a_concurrent_change(
    signed_in: Page, ui_server: Server, seed: Seed
) -> None:
    page = signed_in
    open_page(page, f"#/models/{seed.model_id}")
    description = page.get_by_label("Description", exact=True)
    description.fill("Edited in the browser.")
    page.get_by_label("Tags", exact=True).fill("seed, edited")
    page.get_by_role("button", name="Save details").click()
    expect(page.locator(".model-header .lead")).to_have_text("Edited in the browser.")
    model = ui_server.api.get(f"/models/{seed.model_id}").json()
    assert model["description"] == "Edited in the browser." and model["tags"] == ["edited", "seed"]

    # Someone else saves in between: this save is refused (412) and says so; nothing is lost
    # silently and the form shows the other change.
    r = ui_server.api.patch(f"/models/{seed.model_id}", json={"description": "Changed elsewhere."})
    assert r.status_code == 200
    description.fill("My stale edit.")
    page.get_by_role("button", name="Save details").click()
    expect(page.get_by_text("Someone else changed this model")).to_be_visible()
    expect(page.get_by_label("Description", exact=True)).to_have_value("Changed elsewhere.")
    assert (
        ui_server.api.get(f"/models/{seed.model_id}").json()["description"] == "Changed elsewhere."
    )


def test_a_failed_tensorize_job_shows_its_error(
    signed_in: Page, ui_server: Server, tmp_path: Path
) -> None:
    # config.json passes finalize (it names an architecture) but no worker can build it.
    directory = make_tiny_gpt2(tmp_path / "broken")
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["NoSuchModelForCausalLM"], model_type="no-such-model")
    (directory / "config.json").write_text(json.dumps(config))
    api = ui_server.api
    model = api.post("/models", json={"name": f"acme/broken-{secrets.token_hex(3)}"}).json()
    publish(api, model["id"], directory, finalize=True)

    page = signed_in
    open_page(page, f"#/models/{model['id']}/tensorize")
    page.get_by_label("Dtype").select_option("float32")
    page.get_by_role("button", name="Start tensorize job").click()
    page.get_by_role("heading", level=1, name="Tensorize job").wait_for()
    expect(page.locator(".job-status")).to_contain_text("failed", timeout=120_000)
    alert = page.locator(".problem[role=alert]")
    job = api.get(f"/jobs/{page.url.rsplit('/', 1)[1]}").json()
    expect(alert).to_contain_text(job["error"]["detail"])
    expect(alert).to_contain_text(job["error"]["code"])
    assert page.get_by_role("button", name="Cancel job").is_hidden()
    shot(page, "job-failed")


def test_the_model_list_searches_filters_and_pages(signed_in: Page, ui_server: Server) -> None:
    tag = f"batch-{secrets.token_hex(3)}"
    names = [f"acme/list-{tag}-{i:02d}" for i in range(27)]
    for i, name in enumerate(names):
        description = "the odd one" if i == 13 else "one of many"
        r = ui_server.api.post(
            "/models", json={"name": name, "tags": [tag], "description": description}
        )
        assert r.status_code == 201
    page = signed_in
    open_page(page, "#/models")
    page.get_by_label("Tag", exact=True).fill(tag)
    page.get_by_role("button", name="Search").click()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(25)
    page.get_by_role("link", name="Next page").click()
    expect(rows).to_have_count(2)
    seen = page.locator("tbody th").all_inner_texts()
    assert set(seen) < set(names)
    page.get_by_role("link", name="First page").click()
    expect(rows).to_have_count(25)

    page.get_by_label("Search name or description").fill("odd one")
    page.get_by_role("button", name="Search").click()
    expect(rows).to_have_count(1)
    assert page.locator("tbody th").inner_text() == names[13]
    # A tag chip filters by that tag alone.
    page.get_by_role("link", name=f"Filter by tag {tag}").click()
    expect(rows).to_have_count(25)
    expect(page.get_by_label("Tag", exact=True)).to_have_value(tag)
