"""The `tensor-registry` client commands as subprocesses against a real `tensor-registry serve`."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
from sqlalchemy import update

from harness.artifacts import CONFIG, TOKENIZER, make_artifact
from harness.hf_bytes import tiny_safetensors
from tensor_registry.formats.model_signature import KEYFILE_PATH, PULL_RECORD
from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope, utcnow
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.worker_pool import WorkerRecord
from tests.client.conftest import Registry
from tests.client.lines import LineReader


def _name() -> str:
    return f"acme/cli-{uuid.uuid4().hex[:10]}"


def _hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    (path / "model.safetensors").write_bytes(tiny_safetensors(4096))
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    (path / ".cache").mkdir()
    (path / ".cache" / "junk").write_text("not published")
    return path


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_publish_uploads_resumes_and_finalizes(registry: Registry, tmp_path: Path) -> None:
    name = _name()
    source = _hf_dir(tmp_path / "model")
    # An interrupted publish: the model and a draft exist, one file made it.
    with registry.http() as http:
        model = http.post("/api/v1/models", json={"name": name}).json()
        http.post(f"/api/v1/models/{model['id']}/versions", json={})
        data = (source / "config.json").read_bytes()
        http.put(
            f"/api/v1/models/{model['id']}/versions/1/files/config.json",
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        http.put(
            f"/api/v1/models/{model['id']}/versions/1/files/stale.bin",
            content=b"old",
            headers={"Content-Type": "application/octet-stream"},
        )

    result = registry.cli("publish", str(source), "--model", name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    assert "resuming draft version 1" in result.stderr
    assert "1 file(s) already uploaded, skipped" in result.stderr
    assert "removed stale.bin" in result.stderr
    with registry.http() as http:
        version = http.get(f"/api/v1/models/{model['id']}/versions/1").json()
    assert version["status"] == "ready"
    assert {f["path"]: f["sha256"] for f in version["files"]} == {
        p: hashlib.sha256((source / p).read_bytes()).hexdigest()
        for p in ("config.json", "model.safetensors", "tokenizer.json")
    }

    # A new model from scratch; publishing the same folder again reuses version 1, a changed
    # folder (or --new-version) makes version 2.
    fresh = _name()
    first = registry.cli("publish", str(source), "--model", fresh)
    assert first.returncode == 0 and first.stdout.strip() == "1", first.stderr
    assert f"created model {fresh}" in first.stderr
    again = registry.cli("publish", str(source), "--model", fresh)
    assert again.returncode == 0 and again.stdout.strip() == "1", again.stderr
    assert "version 1 already holds exactly these 3 files" in again.stderr
    assert "reusing it, nothing uploaded" in again.stderr
    with registry.http() as http:
        fresh_id = http.get("/api/v1/models", params={"name": fresh}).json()["items"][0]["id"]
        listed = http.get(f"/api/v1/models/{fresh_id}/versions").json()["items"]
    assert [v["version"] for v in listed] == [1]
    as_json = registry.cli("publish", str(source), "--model", fresh, "--json")
    assert as_json.returncode == 0, as_json.stderr
    reused = json.loads(as_json.stdout)
    assert reused["version"] == 1 and reused["status"] == "ready" and len(reused["files"]) == 3
    (source / "tokenizer.json").write_text('{"version": "1.1"}')
    changed = registry.cli("publish", str(source), "--model", fresh)
    assert changed.returncode == 0 and changed.stdout.strip() == "2", changed.stderr
    forced = registry.cli("publish", str(source), "--model", fresh, "--new-version")
    assert forced.returncode == 0 and forced.stdout.strip() == "3", forced.stderr


def test_publish_prints_each_finalize_problem(registry: Registry, tmp_path: Path) -> None:
    source = tmp_path / "broken"
    source.mkdir()
    (source / "config.json").write_text("{not json")
    (source / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    result = registry.cli("publish", str(source), "--model", _name())
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    error = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    assert "problem(s)" in lines[error]
    problems = lines[error + 1 :]
    # One line per finding, naming the file and what is wrong with it.
    assert any(p.startswith("  config.json: ") for p in problems), result.stderr
    assert any(p.startswith("  model.safetensors: ") for p in problems), result.stderr


async def test_resolve_vllm_args_and_errors(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name, versions=2)
    made = await make_artifact(registry.settings, model=name, version=2, dtype="bfloat16")

    as_json = registry.cli("resolve", f"{name}:2", "--json", "--dtype", "bfloat16", "--ttl", "90")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["artifact"]["id"] == str(made.id) and body["version"] == 2
    human = registry.cli("resolve", name)
    assert human.returncode == 0 and str(made.id) in human.stdout
    assert "tensorizer_uri:" in human.stdout and "model.tensors" in human.stdout

    args = registry.cli("vllm-args", name, "--num-readers", "6")
    assert args.returncode == 0, args.stderr
    parts = shlex.split(args.stdout)
    assert parts[:3] == ["--load-format", "tensorizer", "--model-loader-extra-config"]
    extra = json.loads(parts[3])
    assert extra["num_readers"] == 6 and extra["verify_hash"] is True
    assert httpx.get(extra["tensorizer_uri"]).content == made.files["model.tensors"]

    missing = registry.cli("resolve", f"{name}:1")
    assert missing.returncode == 1
    line = _one_error_line(missing)
    assert "no_matching_artifact" in line and "v1" not in line.split("available")[0]
    assert "versions with a match: 2" in line
    assert "model_not_found" in _one_error_line(registry.cli("resolve", "acme/nothing-here"))
    bad_token = registry.cli("resolve", name, token="trg_" + "z" * 43)
    assert bad_token.returncode == 1
    assert (
        "invalid_token" in _one_error_line(bad_token)
        and "TENSOR_REGISTRY_TOKEN" in bad_token.stderr
    )
    no_scope = registry.cli("resolve", name, token=registry.token_with("models:read"))
    assert "insufficient_scope" in _one_error_line(no_scope)
    down = registry.cli("resolve", name, "--url", "http://127.0.0.1:9")
    assert down.returncode == 1 and "connection_failed" in _one_error_line(down)
    # Its URL said once, not once per layer of the error.
    assert _one_error_line(down).count("http://127.0.0.1:9") == 1, down.stderr
    usage = registry.cli("resolve")
    assert usage.returncode == 2 and "usage:" in usage.stderr
    bad_ref = registry.cli("resolve", "no-namespace")
    assert bad_ref.returncode == 2 and "NAMESPACE/NAME" in bad_ref.stderr


async def test_pull_writes_files_key_and_the_vllm_command_and_caches(
    registry: Registry, tmp_path: Path, cache_dir: Path
) -> None:
    name = _name()
    registry.ready_model(name)
    made = await make_artifact(registry.settings, model=name, version=1, encrypted=True)
    keyholder = registry.token_with("resolve", "keys:read", name="puller")
    dest = tmp_path / "node" / "llama"
    pull = ["pull", name, "--cache-dir", str(cache_dir)]

    result = registry.cli(*pull, "--dest", str(dest), token=keyholder)
    assert result.returncode == 0, result.stderr
    assert (dest / "config.json").read_bytes() == CONFIG
    assert (dest / "tokenizer.json").read_bytes() == TOKENIZER
    assert not (dest / "model.tensors").exists()
    # In the node state directory, never beside the files (model.sig's ignore_paths).
    assert not (dest / "tensorizer.key").exists()
    keyfile = dest / KEYFILE_PATH
    assert keyfile.read_bytes() == made.key
    assert keyfile.stat().st_mode & 0o777 == 0o600
    command = shlex.split(result.stdout.strip())
    assert command[:3] == ["vllm", "serve", str(dest.resolve())]
    assert command[3:6] == ["--load-format", "tensorizer", "--model-loader-extra-config"]
    extra = json.loads(command[6])
    assert extra["encryption_keyfile"] == str(keyfile.resolve())
    assert extra["tensorizer_uri"].startswith(registry.url) and "sig=" in extra["tensorizer_uri"]
    assert set(extra) <= {"tensorizer_uri", "encryption_keyfile", "num_readers", "verify_hash"}
    manifest = json.loads((dest / PULL_RECORD).read_text())
    assert manifest["artifact"]["id"] == str(made.id)
    assert not (dest / ".tensor-registry.json").exists()

    with_weights = tmp_path / "node" / "llama-local"
    before = len(registry.blob_requests())
    local = registry.cli(*pull, "--dest", str(with_weights), "--weights", token=keyholder)
    assert local.returncode == 0, local.stderr
    fetched = registry.blob_requests()[before:]
    # config and tokenizer came from the node cache; only the weights were downloaded.
    assert [r["path"].rsplit("/", 1)[1] for r in fetched] == ["model.tensors"]
    assert (with_weights / "model.tensors").read_bytes() == made.files["model.tensors"]
    extra = json.loads(shlex.split(local.stdout)[6])
    assert extra["tensorizer_uri"] == str(with_weights.resolve() / "model.tensors")

    # Same artifact again, elsewhere: nothing is downloaded at all.
    before = len(registry.blob_requests())
    again = registry.cli(*pull, "--dest", str(tmp_path / "again"), "--weights", token=keyholder)
    assert again.returncode == 0, again.stderr
    assert registry.blob_requests()[before:] == []
    assert "0 B downloaded" in again.stderr
    assert (tmp_path / "again" / "model.tensors").read_bytes() == made.files["model.tensors"]

    # A token without keys:read cannot pull an encrypted artifact, and says why.
    refused = registry.cli(
        *pull, "--dest", str(tmp_path / "nokey"), token=registry.token_with("resolve")
    )
    assert refused.returncode == 1 and "key_access_required" in _one_error_line(refused)
    assert not (tmp_path / "nokey" / KEYFILE_PATH).exists()


async def test_artifacts_sharing_files_share_the_cache(
    registry: Registry, tmp_path: Path, cache_dir: Path
) -> None:
    name = _name()
    registry.ready_model(name, versions=2)
    await make_artifact(registry.settings, model=name, version=1)
    second = await make_artifact(registry.settings, model=name, version=2)
    first_pull = registry.cli(
        "pull", f"{name}:1", "--dest", str(tmp_path / "a"), "--cache-dir", str(cache_dir)
    )
    assert first_pull.returncode == 0, first_pull.stderr
    before = len(registry.blob_requests())
    second_pull = registry.cli(
        "pull",
        f"{name}:2",
        "--dest",
        str(tmp_path / "b"),
        "--weights",
        "--cache-dir",
        str(cache_dir),
    )
    assert second_pull.returncode == 0, second_pull.stderr
    # config.json and tokenizer.json are byte-identical across the two artifacts.
    paths = [r["path"].rsplit("/", 1)[1] for r in registry.blob_requests()[before:]]
    assert paths == ["model.tensors"]
    assert (tmp_path / "b" / "model.tensors").read_bytes() == second.files["model.tensors"]


async def _pretend_a_cpu_worker_is_live(registry: Registry) -> None:
    engine = create_engine(registry.settings.database_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        await session.merge(
            WorkerRecord(
                id="client-tests-fake-worker",
                hostname="nowhere",
                queues=["cpu"],
                capabilities={"cpu": {"memory_total": 64 * 1024**3}},
                last_seen_at=utcnow(),
            )
        )
    await engine.dispose()


async def finish_job(registry: Registry, job_id: str) -> None:
    """Play the worker's last step on a job row: it succeeded."""
    engine = create_engine(registry.settings.database_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        await session.execute(
            update(Job)
            .where(Job.id == uuid.UUID(job_id))
            .values(status="succeeded", stage="done", finished_at=utcnow())
        )
    await engine.dispose()


async def test_tensorize_queues_and_wait_follows_the_job(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name)
    # No worker runs beside this server: a heartbeat row lets the job be queued, and the test
    # plays the worker's part on the job row.
    await _pretend_a_cpu_worker_is_live(registry)
    queued = registry.cli("tensorize", name, "--dtype", "float16", "--format", "hf")
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()
    uuid.UUID(job_id)

    waiting = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensor_registry.cli",
            "tensorize",
            f"{name}:1",
            "--dtype",
            "float16",
            "--format",
            "hf",
            "--wait",
            "--url",
            registry.url,
            "--token",
            registry.token,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err_lines = LineReader(waiting.stderr)
    try:
        # Only once the waiting CLI has its job (its POST answered) may the job end; a fixed
        # pause raced on a loaded machine (the POST came after the end and queued a new job).
        err_lines.wait_for(f"following job {job_id}")
        assert waiting.poll() is None
        await finish_job(registry, job_id)
        # Its stdout is one line (the artifact id): it fits the pipe, so waiting cannot block.
        waiting.wait(timeout=60)
        out = waiting.stdout.read() if waiting.stdout else ""
        err = err_lines.text()
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    with registry.http() as http:
        job = http.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["artifact_id"]
    # The second request named the same variant, so it followed the same job to its end.
    assert out.strip() == job["artifact_id"]
    assert f"job {job_id} succeeded" in err
