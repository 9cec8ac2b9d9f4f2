"""Bad input is a 4xx with a stable code, never a 500: cursors, configs, safetensors headers."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from typing import Any

import httpx
import pytest

from harness.hf_bytes import tiny_safetensors
from tests.factories import create_model, upload

PROBLEM_JSON = "application/problem+json"


def cursor_of(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD_CURSORS = {
    "null": cursor_of([None]),
    "null-pair": cursor_of([None, None]),
    "bool": cursor_of([True]),
    "float": cursor_of([1.5]),
    "nested-list": cursor_of([[[[]]]]),
    "uuid-not-a-string": cursor_of([{"u": 1}]),
    "naive-date": cursor_of(
        [{"d": "2026-01-01T00:00:00"}, {"u": "00000000-0000-0000-0000-0000000000aa"}]
    ),
    "deep": base64.urlsafe_b64encode(nested(300).encode()).decode().rstrip("="),
    "deep-long": base64.urlsafe_b64encode(nested(20_000).encode()).decode().rstrip("="),
    "long": "A" * 5000,
}


@pytest.mark.parametrize("case", sorted(BAD_CURSORS))
async def test_malformed_cursors_are_400_on_every_list_route(
    client: httpx.AsyncClient, case: str
) -> None:
    model = await create_model(client)
    routes = [
        "/api/v1/models",
        f"/api/v1/models/{model['id']}/versions",
        f"/api/v1/models/{model['id']}/artifacts",
        "/api/v1/tokens",
        "/api/v1/audit",
        "/api/v1/jobs",
    ]
    for route in routes:
        r = await client.get(route, params={"cursor": BAD_CURSORS[case]})
        assert r.status_code == 400, (route, r.text)
        assert r.headers["content-type"] == PROBLEM_JSON
        assert r.json()["code"] == "invalid_cursor"


async def finalize_with(client: httpx.AsyncClient, files: dict[str, bytes]) -> httpx.Response:
    model = await create_model(client)
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    number = r.json()["version"]
    for path, data in files.items():
        r = await upload(client, model["id"], number, path, data)
        assert r.status_code == 201, r.text
    return await client.post(f"/api/v1/models/{model['id']}/versions/{number}/finalize")


def problem_codes(r: httpx.Response) -> dict[str | None, str]:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == PROBLEM_JSON
    body = r.json()
    assert body["code"] == "invalid_version"
    return {p["path"]: p["code"] for p in body["problems"]}


def safetensors_with_header(header: bytes) -> bytes:
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    "config",
    [
        nested(50_000).encode(),  # RecursionError in json.loads
        json.dumps({"architectures": ["LlamaForCausalLM"], "x": json.loads(nested(200))}).encode(),
        json.dumps({"architectures": 5}).encode(),
        json.dumps({"architectures": {"0": "LlamaForCausalLM"}}).encode(),
        json.dumps({"architectures": [7]}).encode(),
        json.dumps({"model_type": ["llama"]}).encode(),
    ],
    ids=["deep", "deep-value", "int", "object", "not-names", "model-type-list"],
)
async def test_unusable_config_json_is_422(client: httpx.AsyncClient, config: bytes) -> None:
    r = await finalize_with(
        client, {"config.json": config, "model.safetensors": tiny_safetensors()}
    )
    assert problem_codes(r) == {"config.json": "invalid_config"}


@pytest.mark.parametrize(
    "header",
    [
        nested(50_000).encode(),
        ('{"w": ' + nested(500) + "}").encode(),
        b'{"w": [1, 2]}',
        b'{"w": "F32"}',
    ],
    ids=["deep", "deep-entry", "list-entry", "string-entry"],
)
async def test_unusable_safetensors_header_is_422(client: httpx.AsyncClient, header: bytes) -> None:
    config = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()
    r = await finalize_with(
        client, {"config.json": config, "model.safetensors": safetensors_with_header(header)}
    )
    assert problem_codes(r) == {"model.safetensors": "corrupt_weights"}


@pytest.mark.parametrize(
    "entries",
    [
        {  # bytes 4..8 belong to no tensor
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        },
        {  # b reads a's last 4 bytes
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
        },
        {"a": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}},
        {"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}},
    ],
    ids=["gap", "overlap", "string-dims", "sub-byte-dtype"],
)
async def test_headers_the_worker_would_refuse_are_refused_at_finalize(
    client: httpx.AsyncClient, entries: dict[str, Any]
) -> None:
    # One parser (tensor_registry_server.checkpoints.safetensors) for finalize and the worker: a
    # version that
    # finalizes is one the worker can read. Sub-byte dtypes stay the worker's alone.
    data_bytes = max(entry["data_offsets"][1] for entry in entries.values())
    weights = safetensors_with_header(json.dumps(entries).encode()) + b"\0" * data_bytes
    config = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()
    r = await finalize_with(client, {"config.json": config, "model.safetensors": weights})
    assert problem_codes(r) == {"model.safetensors": "corrupt_weights"}


def many_tensor_safetensors(tensors: int) -> bytes:
    entries = {
        f"layer.{i}.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        for i in range(tensors)
    }
    return safetensors_with_header(json.dumps(entries).encode()) + b"\0" * (4 * tensors)


async def test_a_header_over_the_configured_cap_is_refused(
    client: httpx.AsyncClient, app: Any
) -> None:
    app.state.settings.storage.max_safetensors_header_bytes = 4096
    weights = many_tensor_safetensors(200)
    assert struct.unpack("<Q", weights[:8])[0] > 4096
    config = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()
    r = await finalize_with(client, {"config.json": config, "model.safetensors": weights})
    assert problem_codes(r) == {"model.safetensors": "corrupt_weights"}
    assert "4096" in r.json()["problems"][0]["message"]


def test_the_default_header_cap_is_16_mib() -> None:
    from tensor_registry_server.settings import StorageSettings

    assert StorageSettings().max_safetensors_header_bytes == 16 * 1024 * 1024


async def test_healthz_answers_while_finalize_parses_a_large_header(
    client: httpx.AsyncClient,
) -> None:
    weights = many_tensor_safetensors(120_000)  # a ~8 MiB header: parsing takes seconds
    assert struct.unpack("<Q", weights[:8])[0] > 2 * 1024 * 1024
    model = await create_model(client)
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    number = r.json()["version"]
    config = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()
    for path, data in (("config.json", config), ("model.safetensors", weights)):
        assert (await upload(client, model["id"], number, path, data)).status_code == 201

    started = time.perf_counter()
    finalize = asyncio.create_task(
        client.post(f"/api/v1/models/{model['id']}/versions/{number}/finalize")
    )
    # Each round is one /healthz and a short polling pause; on the loop, the parse would
    # stretch whichever round it lands in to its whole length.
    rounds = []
    while not finalize.done():
        asked = time.perf_counter()
        assert (await client.get("/healthz")).status_code == 200
        await asyncio.sleep(0.02)  # polling interval: leave the parse thread the GIL
        rounds.append(time.perf_counter() - asked)
    r = await finalize
    took = time.perf_counter() - started
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ready"
    # On the loop, one /healthz would wait out the whole parse; off it, none waits long.
    assert len(rounds) > 3
    # On the loop the longest round is the whole parse (measured: 95 % of finalize); off it,
    # rounds still wait for the GIL while json.loads and the collector run in the parse
    # thread (measured: 40-60 %).
    assert max(rounds) < took * 0.8, (max(rounds), took)
