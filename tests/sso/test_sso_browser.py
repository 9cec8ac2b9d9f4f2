"""Headless Chromium signs in through the provider's real login page: into the web UI of a
real `tensor-registry serve`, and for `tensor-registry login --sso` (its loopback listener)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.serve_process import ROOT, ServeProcess
from tests.sso.conftest import CLIENT_ID, PASSWORD, ROLES, Idp
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, _require_browser, stop_with_children

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


@pytest.fixture(scope="module")
def server(idp: Idp, serve_port: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _require_browser()
    process = ServeProcess(
        data_dir=tmp_path_factory.mktemp("sso-serve") / "data",
        port=serve_port,
        env={
            "TENSOR_REGISTRY_ADMIN_TOKEN": "trg_sso-browser-admin-0123456789abcdefghijkl",
            "TENSOR_REGISTRY_SSO__ISSUER": idp.issuer,
            "TENSOR_REGISTRY_SSO__CLIENT_ID": CLIENT_ID,
            "TENSOR_REGISTRY_SSO__ROLES": json.dumps(ROLES),
            "TENSOR_REGISTRY_FETCH__ALLOW": json.dumps(["127.0.0.1"]),
        },
    ).start(timeout=120)
    try:
        yield process.url
    finally:
        stop_with_children(process)


@pytest.fixture(scope="module")
def browser(server: str) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def new_page(browser: Browser, base_url: str) -> tuple[Page, list[str]]:
    """A page that may load only loopback addresses (the registry, the provider, the CLI)."""
    context = browser.new_context(base_url=base_url)
    page = context.new_page()
    outside: list[str] = []

    def guard(route: object) -> None:
        url = route.request.url  # type: ignore[attr-defined]
        if url.startswith(("http://127.0.0.1:", "data:")):
            route.continue_()  # type: ignore[attr-defined]
        else:
            outside.append(url)
            route.abort()  # type: ignore[attr-defined]

    page.route("**/*", guard)
    return page, outside


def log_in_at_idp(page: Page, user: str) -> None:
    page.get_by_role("heading", name="Example IdP sign-in").wait_for()
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Continue").click()


def test_the_web_ui_signs_a_person_in_through_the_providers_login_page(
    browser: Browser, server: str
) -> None:
    from playwright.sync_api import expect

    page, outside = new_page(browser, server)
    page.goto("/")
    page.get_by_role("button", name="Sign in with SSO").click()
    log_in_at_idp(page, "alice")
    page.get_by_role("heading", level=1, name="Models").wait_for(timeout=60_000)
    expect(page.locator("#whoami")).to_contain_text("sso: alice@example.test")
    # The one-time code left the address bar; the token sits in session storage only.
    assert "code=" not in page.url
    token = page.evaluate("sessionStorage.getItem('tensor-registry.token')")
    assert token and token.startswith("trg_")
    page.context.close()
    assert outside == []


def test_someone_without_a_role_is_told_so_on_the_sign_in_page(
    browser: Browser, server: str
) -> None:
    from playwright.sync_api import expect

    page, outside = new_page(browser, server)
    page.goto("/")
    page.get_by_role("button", name="Sign in with SSO").click()
    log_in_at_idp(page, "carol")
    expect(page.get_by_role("alert")).to_contain_text("none of your groups", timeout=60_000)
    assert page.evaluate("sessionStorage.getItem('tensor-registry.token')") is None
    page.context.close()
    assert outside == []


def test_login_sso_takes_the_answer_on_a_loopback_listener(
    browser: Browser, server: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    env["TENSOR_REGISTRY_CONFIG_DIR"] = str(tmp_path / "config")
    cli = subprocess.Popen(
        [sys.executable, "-m", "tensor_registry.cli", "login", "--sso", "--no-browser",
         "--url", server],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert cli.stderr is not None
        for line in cli.stderr:
            lines.append(line.strip())
            if "/api/v1/sso/login?" in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert found.wait(60), lines
        address = next(line for line in lines if "/api/v1/sso/login?" in line)
        page, outside = new_page(browser, server)
        page.goto(address)
        log_in_at_idp(page, "alice")
        page.get_by_text("Signed in.").wait_for(timeout=60_000)
        page.context.close()
        assert cli.wait(60) == 0, lines
    finally:
        if cli.poll() is None:
            cli.kill()
    assert outside == []
    stored = json.loads((tmp_path / "config" / "config.json").read_text())
    assert stored["url"] == server and stored["token"].startswith("trg_")
    deadline = time.monotonic() + 5
    while not any("logged in" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("as token 'sso: alice@example.test'" in line for line in lines), lines
