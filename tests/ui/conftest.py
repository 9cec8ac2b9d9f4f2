"""Browser tests: a real `tensor-registry serve` (API + UI + worker) and headless Debian Chromium
driven by Playwright.

One server per session: embedded default (SQLite, local storage, file-system broker) under a
temporary data dir, admin token from TENSOR_REGISTRY_ADMIN_TOKEN. Every page records the requests
it makes; any request to a host other than the loopback server fails the test that made it.
Screenshots go to test-artifacts/ui/ (gitignored).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from harness.serve_process import ROOT, ServeProcess, free_port
from harness.waiting import wait_job_sync

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Route

CHROMIUM = os.environ.get("TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
IN_CI = os.environ.get("CI", "").lower() == "true"


def _require_browser() -> None:
    problem = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problem = "playwright is not installed (pip install -e '.[dev]')"
    if problem is None and not (Path(CHROMIUM).exists() and os.access(CHROMIUM, os.X_OK)):
        problem = f"{CHROMIUM} is missing (apt-get install chromium)"
    if problem:
        if IN_CI:
            pytest.fail(f"browser tests need a browser in CI: {problem}")
        pytest.skip(problem)


class Server:
    def __init__(self, process: ServeProcess, token: str, import_root: Path) -> None:
        self.process = process
        # Allow-listed for file:// imports.
        self.import_root = import_root
        self.url = process.url
        self.token = token
        self.api = httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )


def stop_with_children(process: ServeProcess) -> None:
    """Stop serve and the worker it started. uvicorn re-raises the SIGTERM it handled, so serve
    can die before its own clean-up stops the worker; this stops whatever is left."""
    import psutil

    assert process.proc is not None
    children = psutil.Process(process.proc.pid).children(recursive=True)
    process.stop()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=20)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    _require_browser()
    token = "trg_ui-" + secrets.token_urlsafe(24)
    base = tmp_path_factory.mktemp("ui-serve")
    imports = base / "imports"
    imports.mkdir()
    process = ServeProcess(
        data_dir=base / "data",
        port=free_port(),
        worker=True,
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": token,
            "TENSOR_REGISTRY_STORAGE__IMPORT_ROOTS": json.dumps([str(imports)]),
            # The Webhooks page's test runs its receiver on loopback (tests/ui/test_webhooks_page).
            "TENSOR_REGISTRY_FETCH__ALLOW": json.dumps(["127.0.0.1"]),
        },
    ).start(timeout=120)
    server = Server(process, token, imports)
    try:
        yield server
    finally:
        server.api.close()
        stop_with_children(process)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# Module scope, not session: while Playwright's sync API is running, its event loop counts as
# the thread's running loop, and the async tests of other modules (and asyncio.run in their
# fixtures) must not run under it.
@pytest.fixture(scope="module")
def browser(ui_server: Server, artifacts_dir: Path) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in {"data", "blob", "about"}:
        return True
    return parts.hostname in LOOPBACK


@dataclass
class Watch:
    """What a page did that a test must not tolerate."""

    external_requests: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)


_WATCHES: dict[int, Watch] = {}


def new_page(browser: Browser, server: Server, *, width: int = 1280, height: int = 900) -> Page:
    """A fresh context (its own session storage) whose requests off loopback are blocked and
    recorded; close it with close_page(), which fails on any of them."""
    context = browser.new_context(
        base_url=server.url,
        viewport={"width": width, "height": height},
        permissions=["clipboard-read", "clipboard-write"],
    )
    context.set_default_timeout(15_000)
    watch = Watch()

    def guard(route: Route) -> None:
        url = route.request.url
        if is_loopback(url):
            route.continue_()
        else:
            watch.external_requests.append(url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    page.on("pageerror", lambda exc: watch.page_errors.append(str(exc)))
    # The UI must run under its own CSP; a violation shows up only on the console.
    page.on(
        "console",
        lambda msg: (
            watch.page_errors.append(msg.text)
            if msg.type == "error" and "Content Security Policy" in msg.text
            else None
        ),
    )
    _WATCHES[id(page)] = watch
    return page


def watch_of(page: Page) -> Watch:
    return _WATCHES[id(page)]


def close_page(page: Page) -> None:
    watch = _WATCHES.pop(id(page))
    page.context.close()
    assert not watch.external_requests, (
        f"the UI requested hosts other than this server: {watch.external_requests}"
    )
    assert not watch.page_errors, f"uncaught errors in the page: {watch.page_errors}"


@pytest.fixture
def page(browser: Browser, ui_server: Server) -> Iterator[Page]:
    p = new_page(browser, ui_server)
    yield p
    close_page(p)


def shot(page: Page, name: str, *, full_page: bool = True) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


@pytest.fixture
def signed_in(browser: Browser, ui_server: Server) -> Iterator[Page]:
    p = new_page(browser, ui_server)
    sign_in(p, ui_server.token)
    yield p
    close_page(p)


# The router's view once drawn: mounted in #main, and no longer aria-busy (tensor_registry_server/
# ui/js/app.js sets it while the view loads).
VIEW_DRAWN = "#main > .view:not([aria-busy])"


def open_view(page: Page, path: str) -> None:
    """Go to `path` (`/#/…`) and wait for the view it draws, done loading. A hash change is
    handled by the page's router in a task of its own: a test that fills and clicks right after
    `goto` can act on the view being replaced (seen under load: a form filled and submitted in
    the old view, then nothing in the new one). The old view is marked first, so the wait is for
    a new one; the same address is loaded again, as the router would not run."""
    page.evaluate("document.querySelector('#main > .view')?.setAttribute('data-left', '')")
    if page.url == urljoin(page.url, path):
        page.reload()
    else:
        page.goto(path)
    page.locator(f"{VIEW_DRAWN}:not([data-left])").wait_for()


def sign_in(page: Page, token: str) -> None:
    page.goto("/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", level=1, name="Models").wait_for()


# A model card with Markdown to render and HTML that must stay text: if any of it ran or loaded,
# the page would show an element or set window.__cardRan.
HOSTILE_CARD = """---
license: apache-2.0
tags:
- text-generation
- tiny
---
# Tiny GPT-2 for the page checks

A **small** model with *emphasis*, `inline code` and a [link](https://example.invalid/docs).

<script>window.__cardRan = true</script>
<img src="x" onerror="window.__cardRan = true">
[click me](javascript:window.__cardRan=true)
![a picture](https://example.invalid/picture.png)

## Evaluation

| task | score |
|------|------:|
| toy  | 0.5   |

- first point
- second point

```python
print("<b>not bold</b>")
```
"""


@dataclass
class Seed:
    model_id: str
    name: str
    draft: int
    job_id: str


def publish(api: httpx.Client, model_id: str, directory: Path, *, finalize: bool) -> int:
    version = api.post(f"/models/{model_id}/versions", json={}).json()["version"]
    for path in sorted(directory.iterdir()):
        r = api.put(
            f"/models/{model_id}/versions/{version}/files/{path.name}",
            content=path.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 201, r.text
    if finalize:
        assert api.post(f"/models/{model_id}/versions/{version}/finalize").status_code == 200
    return int(version)


@pytest.fixture(scope="session")
def seed(ui_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Seed:
    """A model with a ready version (model card included), a draft, an alias, a ready bfloat16
    artifact made by the worker, and a few resolves in the audit log."""
    from tests.hf_fixtures import make_tiny_gpt2

    api = ui_server.api
    directory = make_tiny_gpt2(tmp_path_factory.mktemp("seed") / "tiny")
    (directory / "README.md").write_text(HOSTILE_CARD)
    name = f"acme/pages-{secrets.token_hex(3)}"
    model = api.post(
        "/models",
        json={"name": name, "description": "Seeded for the page checks.", "tags": ["seed"]},
    ).json()
    publish(api, model["id"], directory, finalize=True)
    draft = publish(api, model["id"], directory, finalize=False)
    assert api.put(f"/models/{model['id']}/aliases/prod", json={"version": 1}).status_code == 201
    r = api.post(f"/models/{model['id']}/tensorize", json={"dtype": "bfloat16", "format": "hf"})
    assert r.status_code == 202, r.text
    job = wait_job_sync(api, r.json()["id"])
    assert job["status"] == "succeeded", job
    for ref in ("prod", "latest", "1"):
        resolved = api.get("/resolve", params={"model": name, "ref": ref, "node": "ui-seed"})
        assert resolved.status_code == 200, resolved.text
    return Seed(model_id=model["id"], name=name, draft=draft, job_id=r.json()["id"])
