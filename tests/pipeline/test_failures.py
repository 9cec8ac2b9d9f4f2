"""Failure paths: bad sources, cancel, a worker killed mid-serialize, storage going down.

In every case the job ends with a clear problem-shaped error (or is finished by a later
attempt with correct bytes), and nothing is half-published: no ``ready`` artifact without its
bytes, no bytes under the artifact's prefix unless it is ready.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from harness.waiting import poll_async, wait_job
from tensor_registry_server.settings import Settings
from tests.hf_fixtures import make_tiny_llama
from tests.pipeline.conftest import RedisServer, WorkerProcess
from tests.pipeline.helpers import (
    artifact_dir,
    assert_files_match_storage,
    deserialize,
    get_artifact,
    publish_dir,
    tensorize,
)
from tests.stage_hold import StageHold


def _assert_nothing_published(settings: Settings, artifact: dict[str, Any]) -> None:
    assert artifact["status"] == "failed"
    assert artifact["files"] == []
    assert not artifact_dir(settings, artifact["id"]).exists() or not any(
        artifact_dir(settings, artifact["id"]).iterdir()
    )


def _assert_no_temp_files(settings: Settings) -> None:
    tmp = settings.local_storage_root / ".tmp"
    leftovers = (
        [p for p in tmp.iterdir() if not p.name.startswith("probe-")] if tmp.exists() else []
    )
    assert leftovers == []


async def _failed_job(api: httpx.AsyncClient, model_id: str, **body: Any) -> dict[str, Any]:
    job = await tensorize(api, model_id, **body)
    done = await wait_job(api, job["id"])
    assert done["status"] == "failed", done
    error = done["error"]
    assert set(error) >= {"type", "title", "status", "detail", "code"}
    assert error["type"] == f"urn:tensor-registry:problem:{error['code']}"
    return done


async def test_corrupt_safetensors_fail_with_a_clear_error(
    api: httpx.AsyncClient, settings: Settings, tmp_path: Path, embedded_only: None
) -> None:
    src = make_tiny_llama(tmp_path / "m", with_tokenizer=False)
    model_id, number = await publish_dir(api, src, name="acme/corrupt")
    # The bytes rot in storage after the version was finalized (same size, garbled header).
    version = (await api.get(f"/api/v1/models/{model_id}/versions/{number}")).json()
    [weights] = [f for f in version["files"] if f["path"] == "model.safetensors"]
    stored = [
        p
        for p in (settings.local_storage_root / "versions" / version["id"]).rglob("*")
        if p.name == "model.safetensors"
    ]
    assert len(stored) == 1 and stored[0].stat().st_size == weights["size"]
    data = bytearray(stored[0].read_bytes())
    data[8:40] = b"!" * 32
    stored[0].write_bytes(bytes(data))

    done = await _failed_job(api, model_id, dtype="bfloat16")
    assert done["error"]["code"] == "corrupt_weights"
    assert "model.safetensors" in done["error"]["detail"]
    assert done["attempts"] == 1  # never retried: bad input stays bad
    _assert_nothing_published(settings, await get_artifact(api, done["artifact_id"]))


async def test_config_for_an_unknown_architecture_fails_clearly(
    api: httpx.AsyncClient, settings: Settings, tmp_path: Path, embedded_only: None
) -> None:
    src = make_tiny_llama(tmp_path / "m", with_tokenizer=False)
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["FluxCapacitorForCausalLM"]
    (src / "config.json").write_text(json.dumps(config))
    model_id, _ = await publish_dir(api, src, name="acme/unknown")
    done = await _failed_job(api, model_id, dtype="float16", encrypt=True)
    assert done["error"]["code"] == "unknown_architecture"
    assert "FluxCapacitorForCausalLM" in done["error"]["detail"]
    _assert_nothing_published(settings, await get_artifact(api, done["artifact_id"]))
    # The variant can be asked for again once fixed: failed artifacts are history.
    r = await api.get(f"/api/v1/models/{model_id}/artifacts", params={"status": "failed"})
    assert len(r.json()["items"]) == 1


def _logged(worker: WorkerProcess, needle: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return needle in worker.log_path.read_text(errors="replace")

    return check


def _pool_pid(job: dict[str, Any]) -> int:
    return int(job["worker"].rsplit("/", 1)[1])


async def _held_serializing(api: httpx.AsyncClient, hold: StageHold, job_id: str) -> dict[str, Any]:
    """Wait until the job is held in its serialize stage with some bytes written (the hold was
    armed before the job was submitted), and return the job as the API shows it then."""
    await hold.wait_held()
    job = (await api.get(f"/api/v1/jobs/{job_id}")).json()
    assert job["status"] == "running" and job["progress"]["stage"] == "serialize", job
    return job


def _assert_bytes_match_source(settings: Settings, artifact: dict[str, Any], src: Path) -> None:
    """A float32 artifact of a float32 checkpoint without tied weights: tensor for tensor."""
    from safetensors.torch import load_file

    assert_files_match_storage(settings, artifact)
    expected = load_file(src / "model.safetensors")
    loaded = deserialize(artifact_dir(settings, artifact["id"]) / "model.tensors")
    assert set(loaded) == set(expected)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name


async def test_cancel_while_running_stops_the_worker_and_cleans_up(
    api: httpx.AsyncClient, settings: Settings, big_llama: Path, stage_hold: StageHold
) -> None:
    model_id, _ = await publish_dir(api, big_llama, name="acme/cancel-running")
    stage_hold.arm()
    job = await tensorize(api, model_id, dtype="float32", encrypt=True)
    await _held_serializing(api, stage_hold, job["id"])  # mid-write: the cancel lands there
    try:
        r = await api.post(f"/api/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "running" and r.json()["cancel_requested"] is True
    finally:
        stage_hold.release()
    done = await wait_job(api, job["id"])
    assert done["status"] == "cancelled", done
    assert done["error"]["code"] == "cancelled"
    # A cancelled job's artifact is removed (no `failed` row to list), bytes included.
    assert (await api.get(f"/api/v1/artifacts/{done['artifact_id']}")).status_code == 404
    directory = artifact_dir(settings, done["artifact_id"])
    assert not directory.exists() or not any(directory.iterdir())
    _assert_no_temp_files(settings)
    # Cancelling again is harmless; a finished job cannot be cancelled.
    assert (await api.post(f"/api/v1/jobs/{job['id']}/cancel")).json()["status"] == "cancelled"


def _write_lock_free(path: str, *, wait: float) -> bool:
    """Whether a write lock on the SQLite file at ``path`` could be taken within ``wait`` s."""
    db = sqlite3.connect(path, timeout=wait)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


def _stop_outside_a_write(worker: WorkerProcess, settings: Settings) -> None:
    """SIGSTOP the worker at a moment it holds no SQLite write lock: stopped inside its
    heartbeat's upsert it would keep the database locked, and the API's next write would wait
    out busy_timeout and answer 503 (seen once in CI). PostgreSQL's row locks block no write
    of this test."""
    url = settings.database_url
    if not url.startswith("sqlite"):
        os.kill(worker.pid, signal.SIGSTOP)
        return
    path = url.split(":///", 1)[1]
    for _ in range(200):
        os.kill(worker.pid, signal.SIGSTOP)
        if _write_lock_free(path, wait=0.2):
            return
        os.kill(worker.pid, signal.SIGCONT)  # let it finish that transaction
        _write_lock_free(path, wait=30)  # returns once it has
    raise AssertionError("the worker held the database's write lock 200 times in a row")


async def test_cancel_while_queued_is_immediate(
    api: httpx.AsyncClient, settings: Settings, worker: WorkerProcess, tmp_path: Path
) -> None:
    model_id, _ = await publish_dir(api, make_tiny_llama(tmp_path / "m"), name="acme/cancel-q")
    _stop_outside_a_write(worker, settings)  # the broker holds the message; nobody takes it
    try:
        job = await tensorize(api, model_id, dtype="float16")
        r = await api.post(f"/api/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 200
        assert r.json()["status"] == "cancelled"
        assert r.json()["error"]["code"] == "cancelled"
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    # Its pending artifact is removed with the cancel: nothing lists it as failed.
    assert (await api.get(f"/api/v1/artifacts/{job['artifact_id']}")).status_code == 404
    listed = (await api.get(f"/api/v1/models/{model_id}/artifacts")).json()["items"]
    assert job["artifact_id"] not in [a["id"] for a in listed]
    # The worker gets the message, sees the job cancelled and leaves it alone.
    await poll_async(
        _logged(worker, f"job {job['id']}: not ours to run"),
        what="the worker to skip the cancelled job",
        detail=worker.log_tail,
    )
    after = (await api.get(f"/api/v1/jobs/{job['id']}")).json()
    assert after["status"] == "cancelled" and after["attempts"] == 0
    assert not artifact_dir(settings, job["artifact_id"]).exists()
    # A finished job cannot be cancelled.
    model2, _ = await publish_dir(api, make_tiny_llama(tmp_path / "m2"), name="acme/cancel-done")
    finished = await wait_job(api, (await tensorize(api, model2, dtype="float16"))["id"])
    r = await api.post(f"/api/v1/jobs/{finished['id']}/cancel")
    assert r.status_code == 409 and r.json()["code"] == "job_finished"


async def test_pool_process_killed_mid_serialize_is_redelivered_and_finishes(
    api: httpx.AsyncClient, settings: Settings, big_llama: Path, stage_hold: StageHold
) -> None:
    model_id, _ = await publish_dir(api, big_llama, name="acme/killed")
    stage_hold.arm()  # one-shot: the redelivered attempt runs through
    job = await tensorize(api, model_id, dtype="float32")
    running = await _held_serializing(api, stage_hold, job["id"])
    pid = _pool_pid(running)
    os.kill(pid, signal.SIGKILL)
    artifact = await get_artifact(api, job["artifact_id"])
    assert artifact["status"] in {"pending", "running"}
    assert artifact["files"] == []
    assert not artifact_dir(settings, job["artifact_id"]).exists()

    done = await wait_job(api, job["id"], timeout=180)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    assert _pool_pid(done) != pid
    artifact = await get_artifact(api, job["artifact_id"])
    assert artifact["status"] == "ready" and artifact["stats"]["attempt"] == 2
    _assert_bytes_match_source(settings, artifact, big_llama)


async def test_whole_worker_killed_mid_serialize_is_recovered_by_the_next_worker(
    api: httpx.AsyncClient,
    settings: Settings,
    worker: WorkerProcess,
    big_llama: Path,
    embedded_only: None,
    stage_hold: StageHold,
) -> None:
    """Embedded: the file-system broker forgot the message when it was delivered, so only the
    registry's own sweep can bring the job back (in scaled mode it is the same sweep, or
    Redis' re-delivery after its visibility timeout)."""
    model_id, _ = await publish_dir(api, big_llama, name="acme/worker-lost")
    stage_hold.arm()
    job = await tensorize(api, model_id, dtype="float32")
    await _held_serializing(api, stage_hold, job["id"])
    pool = worker.pool_pids()
    os.kill(worker.pid, signal.SIGKILL)
    for pid in pool:
        os.kill(pid, signal.SIGKILL)
    worker.proc.wait()  # type: ignore[union-attr]
    assert (await get_artifact(api, job["artifact_id"]))["status"] != "ready"
    assert not artifact_dir(settings, job["artifact_id"]).exists()

    # A new worker's sweep sees the job running on a worker that stopped heartbeating.
    worker.start()
    done = await wait_job(api, job["id"], timeout=180)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    artifact = await get_artifact(api, job["artifact_id"])
    _assert_bytes_match_source(settings, artifact, big_llama)


async def test_storage_down_mid_write_fails_clearly_and_publishes_nothing(
    api: httpx.AsyncClient,
    settings: Settings,
    storage_redis: RedisServer,
    big_llama: Path,
    embedded_only: None,
    stage_hold: StageHold,
) -> None:
    """The artifact goes to the ``redis`` storage backend (a private redis-server), which dies
    mid-write: the attempt fails, is retried after a backoff, fails again, and the job gives up
    with a 503-shaped error; the artifact never becomes ready and lists no files."""
    storage_redis.start()
    try:
        model_id, _ = await publish_dir(api, big_llama, name="acme/storage-down")
        stage_hold.arm()
        job = await tensorize(api, model_id, dtype="float32", storage="redis")
        await _held_serializing(api, stage_hold, job["id"])
        try:
            storage_redis.kill()
        finally:
            stage_hold.release()
        done = await wait_job(api, job["id"], timeout=120)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "storage_unavailable"
        assert done["error"]["status"] == 503
        assert done["attempts"] == settings.worker.max_attempts
        artifact = await get_artifact(api, job["artifact_id"])
        assert artifact["status"] == "failed" and artifact["files"] == []
        assert artifact["storage"] == "redis"
    finally:
        storage_redis.kill()
