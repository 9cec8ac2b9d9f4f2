"""/openapi.json declares what routes really answer: problem+json errors, binary blobs, SSE."""

from __future__ import annotations

from typing import Any

import httpx


def _content(doc: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in response:
        response = doc["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    return dict(response.get("content") or {})


async def test_every_operation_declares_its_problem_responses(client: httpx.AsyncClient) -> None:
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    problem = doc["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail", "code"} <= set(problem["required"])
    for status in (400, 401, 403, 404, 409, 412, 413, 415, 416, 422, 429, 503):
        shared = doc["components"]["responses"][f"Problem{status}"]
        assert shared["content"]["application/problem+json"]["schema"] == {
            "$ref": "#/components/schemas/Problem"
        }
    operations = [
        (path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()
    ]
    assert len(operations) >= 30
    for path, method, op in operations:
        responses = op["responses"]
        assert "application/problem+json" in _content(doc, responses["default"]), (path, method)
        for status, response in responses.items():
            # The OCI door answers errors in the distribution spec's body (checked below).
            own_body = path == "/readyz" or path.startswith("/v2/")
            if status.isdigit() and int(status) >= 400 and not own_body:
                assert list(_content(doc, response)) == ["application/problem+json"], (
                    path,
                    method,
                    status,
                )
        if path.startswith("/api/v1/") and not path.startswith(("/api/v1/blobs", "/api/v1/keys")):
            assert {"401", "403", "503"} <= set(responses), (path, method)
        if "{" in path:
            assert "404" in responses, (path, method)

    blob = doc["paths"]["/api/v1/blobs/{storage}/{key}"]
    for method in ("get", "head"):
        for status in ("200", "206"):
            assert "application/octet-stream" in blob[method]["responses"][status]["content"]
        assert "416" in blob[method]["responses"]
    key = doc["paths"]["/api/v1/keys/{artifact_id}"]["get"]["responses"]
    assert "application/octet-stream" in key["200"]["content"]
    events = doc["paths"]["/api/v1/jobs/{job_id}/events"]["get"]["responses"]
    assert "text/event-stream" in events["200"]["content"]
    manifest = doc["paths"]["/v2/{namespace}/{name}/manifests/{reference}"]["get"]["responses"]
    assert "application/vnd.oci.image.manifest.v1+json" in manifest["200"]["content"]
    oci_error = manifest["404"]["content"]["application/json"]["schema"]
    assert oci_error["required"] == ["errors"]
    metrics = doc["paths"]["/metrics"]["get"]["responses"]
    assert list(metrics["200"]["content"]) == ["text/plain"]
    assert "application/json" in doc["paths"]["/readyz"]["get"]["responses"]["503"]["content"]


async def test_errors_are_sent_with_the_declared_media_type(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/v1/models/not-a-uuid")
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    metrics = await client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")


async def test_the_bearer_token_is_declared_where_the_api_wants_it(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token (trg_...): `Authorization: Bearer trg_...`.",
    }
    checked = 0
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            declared = operation.get("security") == [{"bearerAuth": []}]
            signed_url = path.startswith(("/api/v1/blobs/", "/api/v1/keys/"))
            assert declared == (path.startswith("/api/v1/") and not signed_url), (method, path)
            if declared and method == "get" and "{" not in path:
                # What the document says needs a token really does.
                assert (await anon.get(path)).status_code == 401, path
                checked += 1
    assert checked >= 5


def test_every_reference_in_the_document_resolves() -> None:
    # ReDoc renders nothing when one $ref dangles (a door's route kept FastAPI's 422 pointing
    # at HTTPValidationError after the schema was dropped).
    from tensor_registry_server.main import create_app

    doc = create_app().openapi()
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                refs.append(ref)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    dangling = []
    for ref in set(refs):
        target: object = doc
        for part in ref.removeprefix("#/").split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        if target is None:
            dangling.append(ref)
    assert refs and sorted(dangling) == []
