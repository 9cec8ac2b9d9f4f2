"""The Hugging Face door, driven by the real clients (huggingface_hub 2.x, the `hf` CLI,
transformers) against a real `tensor-registry serve` with HF_ENDPOINT pointing at it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.artifacts import MadeArtifact, make_artifact
from harness.waiting import poll
from tests.client.conftest import Registry, registry  # noqa: F401 - the session's real serve
from tests.hf_door.hf import hf_cli, run_hf
from tests.hf_fixtures import make_tiny_llama

pytestmark = pytest.mark.slow

COMMIT = re.compile(r"^[0-9a-f]{40}$")
NAME = "hfdoor/tiny-llama"


@dataclass
class Published:
    name: str
    model_id: str
    source: Path
    files: dict[str, bytes]
    variant: MadeArtifact


@pytest.fixture(scope="module")
def published(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Published:  # noqa: F811
    """The tiny llama as version 1 (alias prod), and a float32 hf variant of it."""
    source = make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    files = {p.name: p.read_bytes() for p in sorted(source.iterdir()) if p.is_file()}
    with registry.http() as http:
        model = http.post("/api/v1/models", json={"name": NAME}).json()
        number = http.post(f"/api/v1/models/{model['id']}/versions", json={}).json()["version"]
        for path, data in files.items():
            r = http.put(
                f"/api/v1/models/{model['id']}/versions/{number}/files/{path}", content=data
            )
            assert r.status_code == 201, r.text
        r = http.post(f"/api/v1/models/{model['id']}/versions/{number}/finalize")
        assert r.status_code == 200, r.text
        r = http.put(f"/api/v1/models/{model['id']}/aliases/prod", json={"version": number})
        assert r.status_code in (200, 201), r.text
    variant = asyncio.run(
        make_artifact(registry.settings, model=NAME, version=number, dtype="float32")
    )
    return Published(NAME, model["id"], source, files, variant)


def _resolve_gets(registry: Registry) -> list[dict[str, Any]]:  # noqa: F811
    """The door's file requests the server has logged so far."""
    found = []
    for line in list(registry.server.lines):
        if '"event": "request"' in line and "/resolve/" in line:
            entry = json.loads(line)
            if "/api/v1/" not in entry["path"]:
                found.append(entry)
    return found


SNAPSHOT = """
from huggingface_hub import snapshot_download
return snapshot_download({name!r}, revision={revision!r})
"""


def _assert_cache_layout(home: Path, name: str, revision: str, folder: Path) -> str:
    repo = home / "hub" / ("models--" + name.replace("/", "--"))
    commit = (repo / "refs" / revision).read_text()
    assert COMMIT.match(commit)
    assert folder == repo / "snapshots" / commit
    for link in folder.iterdir():
        # Each file a link into blobs/, named by the file's sha256 (the ETag the door gives).
        assert link.is_symlink()
        target = link.resolve()
        assert target.parent == repo / "blobs"
        assert target.name == hashlib.sha256(target.read_bytes()).hexdigest()
    return commit


def test_snapshot_download_of_a_source_version(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    folder = Path(
        run_hf(registry.url, registry.token, tmp_path, SNAPSHOT.format(name=NAME, revision="prod"))
    )
    commit = _assert_cache_layout(tmp_path, NAME, "prod", folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == published.files

    # The same name again: the client asks which commit `prod` is, and downloads nothing.
    before = len(_resolve_gets(registry))
    again = run_hf(
        registry.url, registry.token, tmp_path, SNAPSHOT.format(name=NAME, revision="prod")
    )
    assert Path(again) == folder
    assert len(_resolve_gets(registry)) == before

    # main = latest: the same version, the same commit; and the version number names it too.
    for revision in ("main", "1"):
        other = Path(
            run_hf(
                registry.url,
                registry.token,
                tmp_path,
                SNAPSHOT.format(name=NAME, revision=revision),
            )
        )
        assert other == folder
        assert (
            tmp_path / "hub" / f"models--{NAME.replace('/', '--')}" / "refs" / revision
        ).read_text() == commit


def test_snapshot_download_of_a_tensorized_variant(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    revision = "prod.float32.hf.tp1"
    folder = Path(
        run_hf(
            registry.url, registry.token, tmp_path, SNAPSHOT.format(name=NAME, revision=revision)
        )
    )
    commit = _assert_cache_layout(tmp_path, NAME, revision, folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == published.variant.files
    assert "model.tensors" in published.variant.files

    before = len(_resolve_gets(registry))
    assert (
        Path(
            run_hf(
                registry.url,
                registry.token,
                tmp_path,
                SNAPSHOT.format(name=NAME, revision=revision),
            )
        )
        == folder
    )
    assert len(_resolve_gets(registry)) == before

    # One name in every door: the version number with the variant is the same artifact.
    again = Path(
        run_hf(
            registry.url,
            registry.token,
            tmp_path,
            SNAPSHOT.format(name=NAME, revision="1.float32.hf.tp1"),
        )
    )
    assert again.name == commit

    # Each file handed out was audited like a resolve, with the door, path and commit.
    with registry.http() as http:

        def rows() -> list[dict[str, Any]]:
            r = http.get("/api/v1/audit", params={"action": "resolve", "model": NAME, "limit": 500})
            return [
                e
                for e in r.json()["items"]
                if e["detail"].get("door") == "hf" and e["detail"].get("commit") == commit
            ]

        found = poll(
            lambda: rows() if len(rows()) >= len(published.variant.files) else None,
            what="audit rows",
        )
    assert {e["detail"]["path"] for e in found} == set(published.variant.files)
    assert {e["target_id"] for e in found} == {str(published.variant.id)}


def test_model_info_files_refs_and_whoami(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    result = run_hf(
        registry.url,
        registry.token,
        tmp_path,
        f"""
        from huggingface_hub import HfApi
        api = HfApi()
        info = api.model_info({NAME!r}, revision="prod", files_metadata=True)
        variant = api.model_info({NAME!r}, revision="prod.float32.hf.tp1")
        refs = api.list_repo_refs({NAME!r})
        return {{
            "sha": info.sha,
            "siblings": [[s.rfilename, s.size, s.lfs.sha256] for s in info.siblings],
            "variant_sha": variant.sha,
            "variant_files": api.list_repo_files({NAME!r}, revision="prod.float32.hf.tp1"),
            "files": api.list_repo_files({NAME!r}, revision=info.sha),
            "branches": {{b.name: b.target_commit for b in refs.branches}},
            "tags": {{t.name: t.target_commit for t in refs.tags}},
            "whoami": api.whoami()["name"],
            "tree": [
                [f.path, f.size, f.lfs.sha256, f.last_commit.oid]
                for f in api.list_repo_tree({NAME!r}, revision="prod", expand=True)
            ],
            "exists": [
                api.file_exists({NAME!r}, "config.json", revision="prod"),
                api.file_exists({NAME!r}, "nope.bin", revision="prod"),
                api.repo_exists({NAME!r}),
            ],
        }}
        """,
    )
    assert COMMIT.match(result["sha"]) and COMMIT.match(result["variant_sha"])
    assert result["sha"] != result["variant_sha"]
    assert result["siblings"] == [
        [path, len(data), hashlib.sha256(data).hexdigest()]
        for path, data in sorted(published.files.items())
    ]
    assert sorted(result["files"]) == sorted(published.files)
    assert sorted(result["variant_files"]) == sorted(published.variant.files)
    branches, tags = result["branches"], result["tags"]
    assert branches["main"] == branches["prod"] == tags["1"] == result["sha"]
    assert (
        branches["prod.float32.hf.tp1"]
        == branches["main.float32.hf.tp1"]
        == tags["1.float32.hf.tp1"]
        == result["variant_sha"]
    )
    assert result["whoami"]
    assert result["tree"] == [
        [path, len(data), hashlib.sha256(data).hexdigest(), result["sha"]]
        for path, data in sorted(published.files.items())
    ]
    assert result["exists"] == [True, False, True]


def test_range_head_and_tree_pages_over_http(
    registry: Registry,  # noqa: F811
    published: Published,
) -> None:
    from huggingface_hub.utils._pagination import paginate

    weights = published.variant.files["model.tensors"]
    base = f"{registry.url}/{NAME}/resolve/prod.float32.hf.tp1/model.tensors"
    auth = {"Authorization": f"Bearer {registry.token}"}
    head = httpx.head(base, headers=auth)
    assert head.status_code == 200
    assert head.headers["content-length"] == str(len(weights))
    assert head.headers["etag"] == f'"{hashlib.sha256(weights).hexdigest()}"'
    assert COMMIT.match(head.headers["x-repo-commit"])
    assert not any(h.lower().startswith("x-xet") for h in head.headers)
    part = httpx.get(base, headers={**auth, "Range": "bytes=10-99"})
    assert part.status_code == 206
    assert part.content == weights[10:100]
    assert part.headers["content-range"] == f"bytes 10-99/{len(weights)}"

    # The client's own pagination follows the Link header, two entries a page.
    tree = f"{registry.url}/api/models/{NAME}/tree/prod?limit=2"
    pages = list(paginate(tree, params={"recursive": True}, headers=auth))
    assert sorted(e["path"] for e in pages) == sorted(published.files)
    assert all(
        e["lfs"]["oid"] == hashlib.sha256(published.files[e["path"]]).hexdigest() for e in pages
    )


def test_transformers_from_pretrained_gives_the_folders_outputs(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    result = run_hf(
        registry.url,
        registry.token,
        tmp_path,
        f"""
        import torch
        from transformers import AutoModelForCausalLM
        ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
        outputs = []
        for where, revision in (({NAME!r}, "prod"), ({str(published.source)!r}, None)):
            model = AutoModelForCausalLM.from_pretrained(where, revision=revision or "main")
            with torch.no_grad():
                outputs.append(model(ids).logits)
        equal = bool(torch.equal(outputs[0], outputs[1]))
        return {{"equal": equal, "shape": list(outputs[0].shape)}}
        """,
    )
    assert result == {"equal": True, "shape": [1, 6, 320]}


def test_hf_download_cli(registry: Registry, published: Published, tmp_path: Path) -> None:  # noqa: F811
    dest = tmp_path / "out"
    done = hf_cli(
        registry.url,
        registry.token,
        tmp_path / "home",
        "download",
        NAME,
        "--revision",
        "prod",
        "--local-dir",
        str(dest),
    )
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()} == published.files

    # Into the cache, as the README's one-liner (hf_xet installed and not switched off: the
    # door sends no Xet header, so the client downloads over plain HTTP): prints the folder.
    done = hf_cli(
        registry.url,
        registry.token,
        tmp_path / "home",
        "download",
        NAME,
        "--revision",
        "prod.float32.hf.tp1",
        xet_off=False,
    )
    assert done.returncode == 0, done.stderr
    # It prints where the snapshot is ("path: …"), the folder named by the variant's commit.
    folder = Path(re.findall(r"path: (\S+)", done.stdout)[-1])
    assert COMMIT.match(folder.name)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == published.variant.files


ERRORS = """
from huggingface_hub import HfApi, hf_hub_download
out = {{}}
for what, call in (
    ("info", lambda: HfApi().model_info({name!r}, revision={revision!r})),
    ("file", lambda: hf_hub_download({name!r}, "config.json", revision={revision!r})),
):
    try:
        call()
        out[what] = "ok"
    except Exception as exc:
        out[what] = type(exc).__name__
return out
"""


def test_a_token_of_another_namespace_is_told_the_repo_does_not_exist(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    with registry.http() as http:
        r = http.post(
            "/api/v1/tokens",
            json={
                "name": "other-ns",
                "scopes": ["models:read", "resolve"],
                "namespaces": ["other"],
            },
        )
        assert r.status_code == 201, r.text
        other = r.json()["token"]
    # Who the client says it is: the token's name, its namespaces as organizations.
    me = run_hf(
        registry.url, other, tmp_path, "from huggingface_hub import whoami\nreturn whoami()"
    )
    assert me["name"] == "other-ns"
    assert [org["name"] for org in me["orgs"]] == ["other"]
    assert me["auth"]["accessToken"]["role"] == "read"
    for revision in ("prod", "prod.float32.hf.tp1"):
        found = run_hf(registry.url, other, tmp_path, ERRORS.format(name=NAME, revision=revision))
        assert found == {"info": "RepositoryNotFoundError", "file": "RepositoryNotFoundError"}
    # Exactly what a model that does not exist answers: nothing tells them apart.
    hidden = httpx.get(
        f"{registry.url}/api/models/{NAME}", headers={"Authorization": f"Bearer {other}"}
    )
    missing = httpx.get(
        f"{registry.url}/api/models/other/nothing-here",
        headers={"Authorization": f"Bearer {other}"},
    )
    assert hidden.status_code == missing.status_code == 404
    assert hidden.headers["x-error-code"] == missing.headers["x-error-code"] == "RepoNotFound"
    assert {k: v for k, v in hidden.json().items() if k != "request_id"} == {
        k: v.replace("other/nothing-here", NAME) if isinstance(v, str) else v
        for k, v in missing.json().items()
        if k != "request_id"
    }
    # No token, and a wrong one.
    anonymous = run_hf(registry.url, None, tmp_path, ERRORS.format(name=NAME, revision="prod"))
    assert anonymous == {"info": "RepositoryNotFoundError", "file": "RepositoryNotFoundError"}
    wrong = httpx.get(
        f"{registry.url}/api/models/{NAME}", headers={"Authorization": "Bearer trg_wrong"}
    )
    assert wrong.status_code == 401


def test_scopes_sources_need_models_read_and_variants_resolve(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    node = registry.token_with("resolve", name="node")
    reader = registry.token_with("models:read", name="reader")
    url = f"{registry.url}/{NAME}/resolve/%s/config.json"
    assert (
        httpx.head(
            url % "prod.float32.hf.tp1", headers={"Authorization": f"Bearer {node}"}
        ).status_code
        == 200
    )
    assert httpx.head(url % "prod", headers={"Authorization": f"Bearer {node}"}).status_code == 403
    assert (
        httpx.head(url % "prod", headers={"Authorization": f"Bearer {reader}"}).status_code == 200
    )
    assert (
        httpx.head(
            url % "prod.float32.hf.tp1", headers={"Authorization": f"Bearer {reader}"}
        ).status_code
        == 403
    )


def test_unknown_revision_and_file_are_the_clients_own_errors(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    for revision in ("staging", "9", "prod.bfloat16.hf.tp1", "1.float32.hf.tp1.enc", "0" * 40):
        found = run_hf(
            registry.url, registry.token, tmp_path, ERRORS.format(name=NAME, revision=revision)
        )
        assert found == {"info": "RevisionNotFoundError", "file": "RevisionNotFoundError"}, revision
    missing = run_hf(
        registry.url,
        registry.token,
        tmp_path,
        f"""
        from huggingface_hub import hf_hub_download
        try:
            hf_hub_download({NAME!r}, "no-such-file.bin", revision="prod")
        except Exception as exc:
            return type(exc).__name__
        """,
    )
    assert missing == "RemoteEntryNotFoundError"


def test_a_commit_names_one_models_snapshot_and_paths_only_its_files(
    registry: Registry,  # noqa: F811
    published: Published,
) -> None:
    other = "hfdoor/other-model"
    registry.ready_model(other)
    auth = {"Authorization": f"Bearer {registry.token}"}
    commit = httpx.get(f"{registry.url}/api/models/{NAME}/revision/prod", headers=auth).json()[
        "sha"
    ]
    assert (
        httpx.get(f"{registry.url}/{NAME}/resolve/{commit}/config.json", headers=auth).status_code
        == 200
    )
    # The same commit under another repo id (one the token may read) is no revision of it.
    crossed = httpx.head(f"{registry.url}/{other}/resolve/{commit}/config.json", headers=auth)
    assert crossed.status_code == 404
    assert crossed.headers["x-error-code"] == "RevisionNotFound"
    # Only the recorded paths of the snapshot: nothing reaches outside it.
    for path in (
        "..%2F..%2Fsecrets%2Fsigning.key",
        "%2Fetc%2Fpasswd",
        "%2E%2Fconfig.json",
        "CONFIG.JSON",
    ):
        r = httpx.get(f"{registry.url}/{NAME}/resolve/prod/{path}", headers=auth)
        assert r.status_code == 404, path
        assert r.headers["x-error-code"] == "EntryNotFound"
        assert r.headers["x-repo-commit"] == commit


def test_an_encrypted_tensor_parallel_variant_by_its_door_name(
    registry: Registry,  # noqa: F811
    published: Published,
    tmp_path: Path,
) -> None:
    made = asyncio.run(
        make_artifact(
            registry.settings,
            model=NAME,
            version=1,
            dtype="float16",
            format="vllm",
            tensor_parallel_size=2,
            encrypted=True,
        )
    )
    node = registry.token_with("resolve", name="tp-node")
    revision = "1.float16.vllm.tp2.enc"
    folder = Path(
        run_hf(registry.url, node, tmp_path, SNAPSHOT.format(name=NAME, revision=revision))
    )
    _assert_cache_layout(tmp_path, NAME, revision, folder)
    # The files as stored (ciphertext): the key never travels through this door.
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == made.files
    assert {"model-rank-000.tensors", "model-rank-001.tensors"} <= set(made.files)
    assert not any("key" in p.name for p in folder.iterdir())
    # Without `.enc` the same variant names no artifact: encryption is part of the name.
    plain = run_hf(
        registry.url, node, tmp_path, ERRORS.format(name=NAME, revision="1.float16.vllm.tp2")
    )
    assert plain == {"info": "RevisionNotFoundError", "file": "RevisionNotFoundError"}
