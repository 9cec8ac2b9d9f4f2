"""The OCI distribution door (read side) against a real `serve`, with real clients: the oras
Python SDK pulls a source and a variant (same bytes as published), Debian's skopeo reads the
manifests and the tags; and the attacker's side: no token, a bad one, another namespace's,
a revoked one, too few scopes, unknown names and digests, another repository's blob, pushes."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import oras.client
import pytest

from harness.waiting import poll
from tensor_registry_server.oci_door import modelpack
from tests.oci_door.conftest import MODEL, OTHER, TOKEN, Door

SKOPEO = shutil.which("skopeo") or "/usr/bin/skopeo"
VARIANT_TAG = "prod.bfloat16.hf.tp1"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oras_client(
    door: Door, tmp_path: Path, token: str = TOKEN
) -> tuple[oras.client.OrasClient, str]:
    config = str(tmp_path / "docker-config.json")
    client = oras.client.OrasClient(hostname=door.host, insecure=True)
    client.login(username="puller", password=token, hostname=door.host, config_path=config)
    return client, config


def pulled(paths: list[str]) -> dict[str, bytes]:
    return {Path(p).name: Path(p).read_bytes() for p in paths}


def test_oras_pulls_a_source_by_alias_with_the_published_bytes(door: Door, tmp_path: Path) -> None:
    client, config = oras_client(door, tmp_path)
    files = client.pull(
        target=f"{door.host}/{MODEL}:prod", outdir=str(tmp_path / "out"), config_path=config
    )
    assert pulled(files) == door.sources[1]
    files = client.pull(
        target=f"{door.host}/{MODEL}:latest", outdir=str(tmp_path / "latest"), config_path=config
    )
    assert pulled(files) == door.sources[2]


def test_oras_pulls_a_tensorized_variant_with_the_artifact_bytes(
    door: Door, tmp_path: Path
) -> None:
    assert door.variant is not None
    client, config = oras_client(door, tmp_path)
    files = client.pull(
        target=f"{door.host}/{MODEL}:{VARIANT_TAG}", outdir=str(tmp_path / "v"), config_path=config
    )
    assert pulled(files) == door.variant.files
    assert "model.tensors" in door.variant.files
    # An encrypted variant: its (encrypted) files, never its key (that stays behind keys:read).
    assert door.encrypted is not None and door.encrypted.key is not None
    files = client.pull(
        target=f"{door.host}/{MODEL}:latest.float16.hf.tp1.enc",
        outdir=str(tmp_path / "enc"),
        config_path=config,
    )
    assert pulled(files) == door.encrypted.files
    assert not any(door.encrypted.key in data for data in pulled(files).values())


def test_skopeo_reads_the_manifest_and_lists_the_tags(door: Door) -> None:
    creds = f"puller:{TOKEN}"
    raw = subprocess.run(
        [
            SKOPEO,
            "inspect",
            "--raw",
            "--tls-verify=false",
            "--creds",
            creds,
            f"docker://{door.host}/{MODEL}:{VARIANT_TAG}",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert raw.returncode == 0, raw.stderr.decode()
    with door.http() as http:
        served = http.get(f"/v2/{MODEL}/manifests/{VARIANT_TAG}")
    assert raw.stdout == served.content
    manifest = json.loads(raw.stdout)
    assert manifest["artifactType"] == modelpack.ARTIFACT_TYPE
    listed = subprocess.run(
        [
            SKOPEO,
            "list-tags",
            "--tls-verify=false",
            "--creds",
            creds,
            f"docker://{door.host}/{MODEL}",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr.decode()
    tags = json.loads(listed.stdout)["Tags"]
    assert set(tags) == {
        "1",
        "2",
        "latest",
        "prod",
        "1.bfloat16.hf.tp1",
        "prod.bfloat16.hf.tp1",
        "2.float16.hf.tp1.enc",
        "latest.float16.hf.tp1.enc",
    }


def test_manifests_are_modelpack_with_stable_digests(door: Door) -> None:
    with door.http() as http:
        by_alias = http.get(f"/v2/{MODEL}/manifests/prod")
        by_number = http.get(f"/v2/{MODEL}/manifests/1")
        assert by_alias.status_code == 200, by_alias.text
        assert by_alias.content == by_number.content
        digest = sha(by_alias.content)
        assert by_alias.headers["docker-content-digest"] == digest
        assert by_alias.headers["content-type"] == modelpack.MANIFEST_MEDIA_TYPE
        assert int(by_alias.headers["content-length"]) == len(by_alias.content)
        by_digest = http.get(f"/v2/{MODEL}/manifests/{digest}")
        assert by_digest.status_code == 200 and by_digest.content == by_alias.content
        head = http.head(f"/v2/{MODEL}/manifests/prod")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["docker-content-digest"] == digest
        assert head.headers["content-length"] == str(len(by_alias.content))

        manifest = by_alias.json()
        assert manifest["schemaVersion"] == 2
        assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        assert manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
        assert manifest["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
        layers = {
            layer["annotations"]["org.opencontainers.image.title"]: layer
            for layer in manifest["layers"]
        }
        assert {p: layers[p]["mediaType"] for p in layers} == {
            "model.safetensors": "application/vnd.cncf.model.weight.v1.raw",
            "config.json": "application/vnd.cncf.model.weight.config.v1.raw",
            "tokenizer.json": "application/vnd.cncf.model.weight.config.v1.raw",
            "README.md": "application/vnd.cncf.model.doc.v1.raw",
        }
        for path, data in door.sources[1].items():
            assert layers[path]["digest"] == sha(data) and layers[path]["size"] == len(data)

        config = http.get(f"/v2/{MODEL}/blobs/{manifest['config']['digest']}")
        again = http.get(f"/v2/{MODEL}/blobs/{manifest['config']['digest']}")
        assert config.status_code == 200 and config.content == again.content
        assert sha(config.content) == manifest["config"]["digest"]
        assert config.headers["docker-content-digest"] == manifest["config"]["digest"]
        body = config.json()
        assert body["modelfs"] == {
            "type": "layers",
            "diffIds": [layer["digest"] for layer in manifest["layers"]],
        }
        assert body["descriptor"]["name"] == MODEL and body["descriptor"]["version"] == "1"

        variant = http.get(f"/v2/{MODEL}/manifests/{VARIANT_TAG}").json()
        kinds = {
            layer["annotations"]["org.opencontainers.image.title"]: layer["mediaType"]
            for layer in variant["layers"]
        }
        assert kinds["model.tensors"] == modelpack.WEIGHT
        variant_config = http.get(f"/v2/{MODEL}/blobs/{variant['config']['digest']}").json()
        assert variant_config["config"]["precision"] == "bf16"
        assert variant_config["config"]["format"] == "tensorizer"


def test_blobs_by_digest_with_ranges(door: Door) -> None:
    data = door.sources[1]["model.safetensors"]
    digest = sha(data)
    with door.http() as http:
        whole = http.get(f"/v2/{MODEL}/blobs/{digest}", follow_redirects=True)
        assert whole.status_code == 200 and whole.content == data
        part = http.get(
            f"/v2/{MODEL}/blobs/{digest}", headers={"Range": "bytes=8-27"}, follow_redirects=True
        )
        assert part.status_code == 206 and part.content == data[8:28]
        head = http.head(f"/v2/{MODEL}/blobs/{digest}")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == str(len(data))
        assert head.headers["docker-content-digest"] == digest
        if door.backend == "embedded":
            # Served by the registry itself through the blob path.
            assert whole.headers["docker-content-digest"] == digest
            assert part.headers["content-range"] == f"bytes 8-27/{len(data)}"
        else:
            # S3 signs its own GETs: a redirect to the presigned URL, no Authorization on it.
            first = http.get(f"/v2/{MODEL}/blobs/{digest}")
            assert first.status_code == 307
            assert first.headers["docker-content-digest"] == digest
            assert "/v2/" not in first.headers["location"]
        assert door.variant is not None
        weights = door.variant.files["model.tensors"]
        tail = http.get(
            f"/v2/{MODEL}/blobs/{sha(weights)}",
            headers={"Range": "bytes=-100"},
            follow_redirects=True,
        )
        assert tail.status_code == 206 and tail.content == weights[-100:]


def test_tags_list_paginates_in_lexical_order(door: Door) -> None:
    with door.http() as http:
        everything = http.get(f"/v2/{MODEL}/tags/list").json()
        assert everything["name"] == MODEL
        tags = everything["tags"]
        assert tags == sorted(tags) and len(tags) == 8
        first = http.get(f"/v2/{MODEL}/tags/list", params={"n": 2})
        assert first.json()["tags"] == tags[:2]
        assert first.headers["link"] == (f'</v2/{MODEL}/tags/list?n=2&last={tags[1]}>; rel="next"')
        rest = http.get(f"/v2/{MODEL}/tags/list", params={"n": 10, "last": tags[1]})
        assert rest.json()["tags"] == tags[2:] and "link" not in rest.headers
        bad = http.get(f"/v2/{MODEL}/tags/list", params={"n": "many"})
        assert bad.status_code == 400
        assert bad.json()["errors"][0]["code"] == "PAGINATION_NUMBER_INVALID"


def _error(response: object) -> str:
    return str(response.json()["errors"][0]["code"])  # type: ignore[attr-defined]


def test_no_or_bad_credentials_get_the_challenge(door: Door) -> None:
    with door.http(token=None) as anon:
        for path in (
            "/v2/",
            f"/v2/{MODEL}/manifests/prod",
            f"/v2/{MODEL}/tags/list",
            f"/v2/{MODEL}/blobs/{sha(door.sources[1]['config.json'])}",
        ):
            r = anon.get(path)
            assert r.status_code == 401, path
            assert _error(r) == "UNAUTHORIZED"
            challenge = r.headers["www-authenticate"]
            assert challenge.startswith(f'Bearer realm="{door.url}/v2/token",service="')
            assert r.headers["docker-distribution-api-version"] == "registry/2.0"
        assert (
            'scope="repository:acme/llama:pull"'
            in anon.get(f"/v2/{MODEL}/manifests/prod").headers["www-authenticate"]
        )
        assert anon.get("/v2/token").status_code == 401
    for token in ("trg_not-a-real-token-0123456789abcdefghijklmn", "tro1.nonsense"):
        with door.http(token=token) as bad:
            assert bad.get(f"/v2/{MODEL}/manifests/prod").status_code == 401
    with door.basic("trg_not-a-real-token-0123456789abcdefghijklmn") as bad:
        assert bad.get("/v2/token").status_code == 401
        assert bad.get("/v2/").status_code == 401


def test_token_flow_and_basic_auth_and_revocation(door: Door) -> None:
    made = door.token_with("models:read", "resolve")
    with door.basic(made["token"]) as basic:
        assert basic.get("/v2/").status_code == 200
        assert basic.get(f"/v2/{MODEL}/manifests/prod").status_code == 200
        issued = basic.get(
            "/v2/token", params={"service": "tensor-registry", "scope": f"repository:{MODEL}:pull"}
        )
    assert issued.status_code == 200, issued.text
    body = issued.json()
    assert body["token"] == body["access_token"] and 0 < body["expires_in"] <= 300
    assert body["access"] == [{"type": "repository", "name": MODEL, "actions": ["pull"]}]
    assert made["token"] not in body["token"]
    with door.http(token=made["token"]) as api_bearer:
        # The API token itself as a Bearer works too, at the token endpoint as everywhere.
        assert api_bearer.get("/v2/token").status_code == 200
    with door.http(token=body["token"]) as flow:
        assert flow.get(f"/v2/{MODEL}/manifests/{VARIANT_TAG}").status_code == 200
        # A bearer of the flow cannot mint the next one (it would never expire).
        assert flow.get("/v2/token").status_code == 401
        # A bearer whose signature was altered is refused.
        forged = body["token"][:-2] + ("AA" if not body["token"].endswith("AA") else "BB")
        with door.http(token=forged) as bad:
            assert bad.get(f"/v2/{MODEL}/manifests/prod").status_code == 401
        with door.http() as admin:
            assert admin.delete(f"/api/v1/tokens/{made['id']}").status_code == 204
        # Revoking the API token stops its bearers at once.
        refused = flow.get(f"/v2/{MODEL}/manifests/prod")
        assert refused.status_code == 401 and _error(refused) == "UNAUTHORIZED"
    with door.http() as admin:
        rows = admin.get("/api/v1/audit", params={"action": "oci.token"}).json()["items"]
    assert any(row["target_id"] == made["id"] for row in rows)


def test_another_namespace_is_denied_alike_whether_or_not_it_exists(door: Door) -> None:
    other_ns = door.token_with("models:read", "resolve", namespaces=["globex"])
    with door.basic(other_ns["token"]) as basic:
        for path in (
            f"/v2/{MODEL}/manifests/prod",
            f"/v2/{MODEL}/tags/list",
            f"/v2/{MODEL}/blobs/{sha(door.sources[1]['model.safetensors'])}",
            "/v2/acme/does-not-exist/manifests/prod",
        ):
            r = basic.get(path)
            assert r.status_code == 403, path
            assert _error(r) == "DENIED"
        assert basic.get("/v2/globex/nothing/manifests/prod").status_code == 404
        # The token flow grants nothing outside the token's namespaces.
        issued = basic.get("/v2/token", params={"scope": f"repository:{MODEL}:pull"}).json()
        assert issued["access"] == []


def test_scopes_apply_as_on_the_api(door: Door) -> None:
    reader = door.token_with("models:read")
    with door.basic(reader["token"]) as basic:
        assert basic.get(f"/v2/{MODEL}/manifests/prod").status_code == 200
        variant = basic.get(f"/v2/{MODEL}/manifests/{VARIANT_TAG}")
        assert variant.status_code == 403 and _error(variant) == "DENIED"
        assert door.variant is not None
        weights = basic.get(f"/v2/{MODEL}/blobs/{sha(door.variant.files['model.tensors'])}")
        assert weights.status_code == 403
    node = door.token_with("resolve")
    with door.basic(node["token"]) as basic:
        assert basic.get(f"/v2/{MODEL}/manifests/{VARIANT_TAG}").status_code == 200
        source = basic.get(f"/v2/{MODEL}/manifests/prod")
        assert source.status_code == 403 and _error(source) == "DENIED"
        assert basic.get(f"/v2/{MODEL}/tags/list").status_code == 200
    nothing = door.token_with("tensorize")
    with door.basic(nothing["token"]) as basic:
        assert basic.get(f"/v2/{MODEL}/tags/list").status_code == 403


def test_unknown_names_tags_and_digests_answer_404_in_the_spec_body(door: Door) -> None:
    missing = "sha256:" + "0" * 64
    with door.http() as http:
        cases = {
            f"/v2/{MODEL}/manifests/canary": "MANIFEST_UNKNOWN",
            f"/v2/{MODEL}/manifests/9": "MANIFEST_UNKNOWN",
            f"/v2/{MODEL}/manifests/2.float16.vllm.tp2.enc": "MANIFEST_UNKNOWN",
            f"/v2/{MODEL}/manifests/{missing}": "MANIFEST_UNKNOWN",
            f"/v2/{MODEL}/blobs/{missing}": "BLOB_UNKNOWN",
            "/v2/acme/nothing/manifests/prod": "NAME_UNKNOWN",
            "/v2/acme/nothing/tags/list": "NAME_UNKNOWN",
            "/v2/a/b/c/manifests/prod": "NAME_UNKNOWN",
        }
        for path, code in cases.items():
            r = http.get(path)
            assert (r.status_code, _error(r)) == (404, code), path
            assert r.headers["content-type"] == "application/json"
        head = http.head(f"/v2/{MODEL}/manifests/canary")
        assert head.status_code == 404 and head.content == b""
        assert http.get(f"/v2/{MODEL}/blobs/sha256:xyz").status_code == 400


def test_a_digest_of_another_repository_is_not_served_here(door: Door) -> None:
    theirs = sha(door.other["model.safetensors"])
    with door.http() as http:
        assert http.head(f"/v2/{OTHER}/blobs/{theirs}").status_code == 200
        r = http.get(f"/v2/{MODEL}/blobs/{theirs}")
        assert (r.status_code, _error(r)) == (404, "BLOB_UNKNOWN")
        their_manifest = http.get(f"/v2/{OTHER}/manifests/1").headers["docker-content-digest"]
        r = http.get(f"/v2/{MODEL}/manifests/{their_manifest}")
        assert (r.status_code, _error(r)) == (404, "MANIFEST_UNKNOWN")


def test_pushes_are_refused_as_unsupported(door: Door) -> None:
    with door.http() as http:
        for method, path in (
            ("PUT", f"/v2/{MODEL}/manifests/3"),
            ("POST", f"/v2/{MODEL}/blobs/uploads/"),
            ("PATCH", f"/v2/{MODEL}/blobs/uploads/x"),
            ("DELETE", f"/v2/{MODEL}/manifests/prod"),
        ):
            r = http.request(
                method, path, content=b"{}", headers={"Content-Type": "application/json"}
            )
            assert (r.status_code, _error(r)) == (405, "UNSUPPORTED"), (method, path)


def test_reads_are_audited_like_url_issuance(door: Door) -> None:
    data = door.sources[2]["config.json"]
    with door.http() as http:
        assert http.get(f"/v2/{MODEL}/manifests/2").status_code == 200
        http.get(f"/v2/{MODEL}/blobs/{sha(data)}")

        def rows(action: str) -> list[dict[str, object]]:
            items = http.get("/api/v1/audit", params={"action": action}).json()["items"]
            return [
                row
                for row in items
                if row["detail"].get("digest") in (sha(data), None)
                or row["detail"].get("reference") == "2"
            ]

        poll(
            lambda: any(r["detail"].get("reference") == "2" for r in rows("oci.manifest")),
            what="the oci.manifest audit row",
        )
        blob_rows = poll(
            lambda: [r for r in rows("oci.blob") if r["detail"].get("path") == "config.json"],
            what="the oci.blob audit row",
        )
    assert blob_rows[0]["model"] == MODEL and blob_rows[0]["target_type"] == "version"


def test_basic_header_forms(door: Door) -> None:
    with door.http(token=None) as anon:
        good = base64.b64encode(f"u:{TOKEN}".encode()).decode()
        assert anon.get("/v2/", headers={"Authorization": f"Basic {good}"}).status_code == 200
        for value in ("Basic !!!", "Basic " + base64.b64encode(b"nopassword").decode(), "Digest x"):
            assert anon.get("/v2/", headers={"Authorization": value}).status_code == 401


@pytest.mark.parametrize("tag", ["prod", VARIANT_TAG])
def test_head_by_tag_matches_get(door: Door, tag: str) -> None:
    with door.http() as http:
        got = http.get(f"/v2/{MODEL}/manifests/{tag}")
        head = http.head(f"/v2/{MODEL}/manifests/{tag}")
    assert head.headers["docker-content-digest"] == got.headers["docker-content-digest"]


def test_skopeo_copies_a_variant_into_an_oci_layout_verifying_every_digest(
    door: Door, tmp_path: Path
) -> None:
    """containers/image checks each blob's digest and size as it copies: the door's bytes are
    the recorded ones, the config blob's digest holds, the layout keeps the manifest as served."""
    assert door.variant is not None
    layout = tmp_path / "layout"
    done = subprocess.run(
        [SKOPEO, "copy", "--src-tls-verify=false", "--src-creds", f"puller:{TOKEN}",
         f"docker://{door.host}/{MODEL}:{VARIANT_TAG}", f"oci:{layout}:{VARIANT_TAG}"],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    blobs = layout / "blobs" / "sha256"
    for name, data in door.variant.files.items():
        assert (blobs / hashlib.sha256(data).hexdigest()).read_bytes() == data, name
    with door.http() as http:
        served = http.get(f"/v2/{MODEL}/manifests/{VARIANT_TAG}")
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["digest"] == served.headers["docker-content-digest"]
