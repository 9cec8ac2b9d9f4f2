"""Issue 36 §2: a namespace that fills up while a tensorize runs fails the job at publish with
storage_quota_exceeded, and the worker deletes everything it wrote (no artifact bytes, no
temporary objects, no files rows)."""

from __future__ import annotations

from pathlib import Path

import httpx

from harness.waiting import wait_job
from tensor_registry_server.settings import Settings
from tests.pipeline.helpers import artifact_dir, publish_dir, tensorize
from tests.stage_hold import StageHold


async def test_a_quota_passed_while_the_job_ran_fails_it_at_publish_and_cleans_up(
    api: httpx.AsyncClient, settings: Settings, big_llama: Path, stage_hold: StageHold
) -> None:
    model_id, _ = await publish_dir(api, big_llama, name="quota/at-publish")
    tmp = settings.local_storage_root / ".tmp"
    # The storage is shared with the module's other tests: only what this job leaves counts.
    before = set(tmp.iterdir()) if tmp.exists() else set()
    stage_hold.arm()
    job = await tensorize(api, model_id, dtype="float32", encrypt=False)
    try:
        await stage_hold.wait_held()  # mid-serialize: enqueued under the quota
        used = (await api.get("/api/v1/namespaces/quota/usage")).json()["usage"]["storage_bytes"]
        r = await api.put("/api/v1/namespaces/quota/limits", json={"storage_bytes": used})
        assert r.status_code == 200, r.text
    finally:
        stage_hold.release()
    done = await wait_job(api, job["id"])
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "storage_quota_exceeded", done["error"]
    directory = artifact_dir(settings, done["artifact_id"])
    assert not directory.exists() or not any(p.is_file() for p in directory.rglob("*"))
    left = set(tmp.iterdir()) - before if tmp.exists() else set()
    assert [p for p in left if not p.name.startswith("probe-")] == []
    usage = (await api.get("/api/v1/namespaces/quota/usage")).json()["usage"]
    assert usage == {"storage_bytes": used, "active_jobs": 0, "models": 1}
