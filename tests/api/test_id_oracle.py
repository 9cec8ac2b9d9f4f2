"""No existence oracle by id (issue 26 §5): every route that takes an id answers a
namespace-limited token for another namespace's model, version, alias, artifact or job exactly
as it answers for an id that does not exist (404, same code). Routes that take a *name* check
the namespace before any lookup (403 `namespace_forbidden` whether or not it exists)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from fastapi import FastAPI

from tests.factories import auth, create_model, create_token, ready_version
from tests.metrics_traffic import pretend_a_gpu_worker_is_live


async def _foreign_rows(app: FastAPI, client: httpx.AsyncClient) -> dict[str, str]:
    """other/secret with a ready version, an alias, and a tensorize job with its artifact."""
    await pretend_a_gpu_worker_is_live(app)
    model = await create_model(client, name="other/secret")
    version = await ready_version(client, model["id"])
    r = await client.put(
        f"/api/v1/models/{model['id']}/aliases/prod", json={"version": version["version"]}
    )
    assert r.status_code in (200, 201), r.text
    r = await client.post(
        f"/api/v1/models/{model['id']}/tensorize", json={"dtype": "float16", "format": "hf"}
    )
    assert r.status_code == 202, r.text
    job = r.json()
    return {
        "model": model["id"],
        "number": str(version["version"]),
        "job": job["id"],
        "artifact": job["artifact_id"],
    }


def _requests(ids: dict[str, str]) -> list[tuple[str, str, Any]]:
    m, n, j, a = ids["model"], ids["number"], ids["job"], ids["artifact"]
    return [
        ("GET", f"/api/v1/models/{m}", None),
        ("PATCH", f"/api/v1/models/{m}", {"description": "x"}),
        ("DELETE", f"/api/v1/models/{m}", None),
        ("GET", f"/api/v1/models/{m}/versions", None),
        ("POST", f"/api/v1/models/{m}/versions", {}),
        ("GET", f"/api/v1/models/{m}/versions/{n}", None),
        ("DELETE", f"/api/v1/models/{m}/versions/{n}", None),
        ("GET", f"/api/v1/models/{m}/versions/{n}/files/config.json", None),
        ("DELETE", f"/api/v1/models/{m}/versions/{n}/files/config.json", None),
        ("POST", f"/api/v1/models/{m}/versions/{n}/finalize", None),
        ("GET", f"/api/v1/models/{m}/versions/{n}/manifest", None),
        ("GET", f"/api/v1/models/{m}/aliases", None),
        ("GET", f"/api/v1/models/{m}/aliases/prod", None),
        ("PUT", f"/api/v1/models/{m}/aliases/prod", {"version": int(n)}),
        ("DELETE", f"/api/v1/models/{m}/aliases/prod", None),
        ("POST", f"/api/v1/models/{m}/tensorize", {"dtype": "float16", "format": "hf"}),
        ("GET", f"/api/v1/models/{m}/artifacts", None),
        ("GET", f"/api/v1/artifacts/{a}", None),
        ("DELETE", f"/api/v1/artifacts/{a}", None),
        ("GET", f"/api/v1/jobs/{j}", None),
        ("POST", f"/api/v1/jobs/{j}/cancel", None),
    ]


async def test_another_namespaces_ids_answer_like_missing_ones(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    foreign = await _foreign_rows(app, client)
    missing = {k: str(uuid.uuid4()) for k in ("model", "job", "artifact")} | {"number": "1"}
    limited = await create_token(
        client,
        scopes=["models:read", "models:write", "tensorize", "resolve", "keys:read"],
        namespaces=["acme"],
    )
    h = auth(limited)
    for (method, path, body), (_, missing_path, _) in zip(
        _requests(foreign), _requests(missing), strict=True
    ):
        theirs = await client.request(method, path, json=body, headers=h)
        absent = await client.request(method, missing_path, json=body, headers=h)
        assert theirs.status_code == 404, (method, path, theirs.status_code, theirs.text)
        assert (theirs.status_code, theirs.json()["code"]) == (
            absent.status_code,
            absent.json()["code"],
        ), (method, path)
        assert "other/secret" not in theirs.text
    # Nothing was changed through them.
    r = await client.get(f"/api/v1/models/{foreign['model']}")
    assert r.status_code == 200 and r.json()["description"] == ""
    assert (await client.get(f"/api/v1/jobs/{foreign['job']}")).json()["status"] != "cancelled"
    # By name, the namespace is checked first: the same 403 whether the name exists or not.
    for name in ("other/secret", "other/absent"):
        r = await client.post("/api/v1/models", json={"name": name}, headers=h)
        assert (r.status_code, r.json()["code"]) == (403, "namespace_forbidden")
