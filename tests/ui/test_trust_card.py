"""The artifact card shows the signature status and the provenance the worker signed."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.waiting import wait_job_sync, wait_live_worker_sync
from tests.hf_fixtures import make_tiny_gpt2
from tests.ui.conftest import Server, close_page, new_page, sign_in

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.browser


@pytest.fixture
def signed_in(browser: Browser, ui_server: Server) -> Iterator[Page]:
    page = new_page(browser, ui_server)
    sign_in(page, ui_server.token)
    yield page
    close_page(page)


def test_the_artifact_card_shows_signature_and_provenance(
    signed_in: Page, ui_server: Server, tmp_path: Path
) -> None:
    api = ui_server.api
    directory = make_tiny_gpt2(tmp_path / "tiny")
    model = api.post("/models", json={"name": f"acme/signed-{secrets.token_hex(3)}"}).json()
    version = api.post(f"/models/{model['id']}/versions", json={}).json()["version"]
    for path in sorted(directory.iterdir()):
        r = api.put(
            f"/models/{model['id']}/versions/{version}/files/{path.name}",
            content=path.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 201, r.text
    assert api.post(f"/models/{model['id']}/versions/{version}/finalize").status_code == 200
    wait_live_worker_sync(api)
    r = api.post(f"/models/{model['id']}/tensorize", json={"dtype": "float32", "format": "hf"})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = wait_job_sync(api, job_id)
    artifact = api.get(f"/artifacts/{job['artifact_id']}").json()
    key_id = artifact["stats"]["manifest_key_id"]

    page = signed_in
    page.goto(f"/#/models/{model['id']}")
    card = page.locator(f"article[data-artifact='{artifact['id']}']")
    card.wait_for()
    text = card.inner_text()
    assert f"signed manifest (key {key_id[:16]}" in text
    assert f"version {version} (" in text
    assert job_id in text
    assert f"torch {artifact['stats']['provenance']['toolchain']['torch']}" in text
    assert "none (CPU)" in text
    assert artifact["stats"]["compatibility_key"][:23] in text
