"""Setting, reading and removing retention policies over HTTP: admins set them, readers read
them, namespace limits hold, bad input is a problem+json 422."""

from __future__ import annotations

import httpx

from tests.factories import auth, create_model, create_token


async def test_an_admin_sets_reads_and_removes_namespace_and_model_policies(
    client: httpx.AsyncClient,
) -> None:
    model = await create_model(client, name="acme/kept")
    base = f"/api/v1/models/{model['id']}/retention"
    r = await client.get(base)
    assert r.status_code == 200
    assert r.json()["policy"] is None and r.json()["effective"] is None

    r = await client.put("/api/v1/namespaces/acme/retention", json={"keep_last": 5})
    assert r.status_code == 200, r.text
    assert r.json()["policy"]["keep_last"] == 5 and r.json()["policy"]["keep_days"] == 30
    effective = (await client.get(base)).json()["effective"]
    assert (effective["source"], effective["keep_last"]) == ("namespace", 5)

    r = await client.put(base, json={"keep_last": 2, "keep_days": 7.5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "acme/kept" and body["policy"]["source"] == "model"
    assert (body["effective"]["keep_last"], body["effective"]["keep_days"]) == (2, 7.5)
    assert body["policy"]["updated_by"] == "bootstrap-admin"

    assert (await client.delete(base)).status_code == 204
    assert (await client.get(base)).json()["effective"]["source"] == "namespace"
    assert (await client.delete(base)).status_code == 404
    audit = (await client.get("/api/v1/audit", params={"action": "retention.set"})).json()
    assert len(audit["items"]) == 2


async def test_only_admins_set_policies_and_namespace_limits_apply(
    client: httpx.AsyncClient,
) -> None:
    model = await create_model(client, name="acme/guarded")
    writer = await create_token(client, scopes=["models:read", "models:write"])
    r = await client.put(
        "/api/v1/namespaces/acme/retention", json={"keep_last": 1}, headers=auth(writer)
    )
    assert r.status_code == 403
    assert r.json()["code"] == "insufficient_scope"
    r = await client.put(
        f"/api/v1/models/{model['id']}/retention", json={"keep_last": 1}, headers=auth(writer)
    )
    assert r.status_code == 403
    other_admin = await create_token(client, scopes=["admin"], namespaces=["other"])
    r = await client.put(
        "/api/v1/namespaces/acme/retention", json={"keep_last": 1}, headers=auth(other_admin)
    )
    assert r.status_code == 403 and r.json()["code"] == "namespace_forbidden"
    r = await client.put(
        f"/api/v1/models/{model['id']}/retention", json={"keep_last": 1}, headers=auth(other_admin)
    )
    assert r.status_code == 404  # another namespace's model is not there for this token
    r = await client.get("/api/v1/namespaces/acme/retention", headers=auth(writer))
    assert r.status_code == 200


async def test_bad_policies_are_refused(client: httpx.AsyncClient) -> None:
    for body in ({"keep_last": 0}, {"keep_last": 1, "keep_days": -1}, {}, {"keep_last": "x"}):
        r = await client.put("/api/v1/namespaces/acme/retention", json=body)
        assert r.status_code == 422, body
        assert r.headers["content-type"].startswith("application/problem+json")
    r = await client.put("/api/v1/namespaces/Bad%20NS/retention", json={"keep_last": 1})
    assert r.status_code == 422 and r.json()["code"] == "invalid_namespace"
    assert (await client.get("/api/v1/namespaces/acme/retention")).json()["policy"] is None
