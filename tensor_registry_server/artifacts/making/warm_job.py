"""The warm job: vLLM's compile cache for a ready artifact, published as a signed warm bundle.

Glue only: the steps are artifacts/making/warm_steps.py's (lay out the model, serve once, pack), the
signed statement trust/statements.py's, every state change jobs/warm_bundles.py's (all under
tensor_registry_server/).
A failure or a cancel leaves no bundle bytes behind (the tar is removed) and no ready bundle.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from tensor_registry.formats.signed_manifest import ManifestFile
from tensor_registry.formats.warm import BUNDLE_FILE
from tensor_registry.formats.warm_bundle import WarmBundleError, logged_dirs
from tensor_registry_server.artifacts.making.attempt import fresh_workdir
from tensor_registry_server.artifacts.making.warm_steps import (
    WarmMakingError,
    cache_facts,
    lay_out_model,
    model_dir,
    pack_into,
    serve_once,
    warm_key,
)
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.jobs import warm_bundles
from tensor_registry_server.jobs.artifact_reads import artifact_row
from tensor_registry_server.jobs.runner import (
    JobCancelled,
    JobContext,
    JobFailure,
    JobLost,
    nudge,
)
from tensor_registry_server.rows.artifacts import Artifact, ArtifactStatus
from tensor_registry_server.rows.jobs import Job
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.warm_bundles import WarmBundle
from tensor_registry_server.storage.base import Storage
from tensor_registry_server.trust.signing_keys import manifest_keys
from tensor_registry_server.trust.statements import signed_warm_bundle

log = logging.getLogger("tensor_registry.worker")


@dataclass
class Rows:
    bundle: WarmBundle
    artifact: Artifact
    model: str


async def _load(ctx: JobContext) -> Rows:
    bundle_id = warm_bundles.bundle_id_of(ctx.job)
    async with ctx.runtime.task_session() as session:
        bundle = await warm_bundles.mark_running(session, bundle_id) if bundle_id else None
        artifact = await artifact_row(session, ctx.job.artifact_id) if ctx.job.artifact_id else None
        model = await session.scalar(select(Model.name).where(Model.id == ctx.job.model_id))
    if bundle is None or artifact is None or model is None:
        raise JobFailure("bundle_not_found", "the warm bundle or its artifact is gone", status=404)
    if artifact.status != ArtifactStatus.READY:
        raise JobFailure("artifact_not_ready", f"artifact {artifact.id} is {artifact.status}")
    return Rows(bundle, artifact, model)


def run_warm(ctx: JobContext) -> None:
    rows = ctx.runtime.run(_load(ctx))
    storage = ctx.runtime.storages.get(rows.artifact.storage)
    workdir = fresh_workdir(ctx.settings.data_dir, ctx.job.id)
    key = warm_bundles.bundle_key(rows.artifact, rows.bundle.id)
    published = False
    try:
        fields, result = _make(ctx, rows, storage, workdir, key)
        ctx.checkpoint("publish")
        published = _publish(ctx, fields=fields, result=result)
    except WarmMakingError as exc:
        raise JobFailure(exc.code, exc.detail) from None
    except WarmBundleError as exc:
        raise JobFailure(exc.code, exc.message) from None
    finally:
        if not published:
            try:
                ctx.runtime.run(storage.delete(key))
            except Exception:
                log.debug("no bundle bytes to remove at %s", key, exc_info=True)
        shutil.rmtree(workdir, ignore_errors=True)


def _make(
    ctx: JobContext, rows: Rows, storage: Storage, workdir: Path, key: str
) -> tuple[dict[str, object], dict[str, object]]:
    """Lay out, serve once, pack, sign: the bundle row's fields and the job's result."""
    settings = ctx.settings
    root = Path(settings.worker.warm_model_root or settings.data_dir / "warm-models").resolve()
    cache_root = workdir / "vllm-cache"
    ctx.checkpoint("layout")
    model = model_dir(root, rows.artifact.id)
    lay_out_model(storage, [(f.path, f.storage_key) for f in rows.artifact.files], model)
    ctx.checkpoint("serve")
    serve_args = list(rows.bundle.serve_args or [])
    log_text = serve_once(
        model,
        cache_root=cache_root,
        dtype=rows.artifact.dtype,
        tensor_parallel_size=rows.artifact.tensor_parallel_size,
        serve_args=serve_args,
        log_path=workdir / "vllm.log",
        timeout=settings.worker.warm_timeout_seconds,
        check=lambda stage: ctx.progress(stage, 0, None),
    )
    ctx.checkpoint("pack")
    packed = pack_into(storage, key, cache_root, max_bytes=settings.worker.warm_max_bundle_bytes)
    logged = logged_dirs(cache_root, log_text)
    if logged is not None and not set(logged) <= set(packed.dirs):
        raise JobFailure(
            "cache_outside_root", f"vLLM used {logged}, not a directory under its VLLM_CACHE_ROOT"
        )
    wkey = warm_key(
        model=model,
        dtype=rows.artifact.dtype,
        tensor_parallel_size=rows.artifact.tensor_parallel_size,
        serve_args=serve_args,
    )
    cache = cache_facts(packed, logged)
    statement = signed_warm_bundle(
        manifest_keys(settings),
        registry=settings.public_base_url,
        bundle={
            "id": str(rows.bundle.id),
            "artifact_id": str(rows.artifact.id),
            "model_id": str(rows.artifact.model_id),
            "model": rows.model,
            "version": rows.artifact.version_number,
        },
        key=wkey.as_dict(),
        cache=cache,
        tar=ManifestFile(BUNDLE_FILE, packed.size, packed.sha256),
        signed_at=utcnow().isoformat().replace("+00:00", "Z"),
    )
    fields: dict[str, object] = {
        "storage_key": key,
        "size": packed.size,
        "sha256": packed.sha256,
        "key": wkey.as_dict(),
        "cache": cache,
        "statement": statement.decode(),
    }
    result: dict[str, object] = {
        "bundle_id": str(rows.bundle.id),
        "size": packed.size,
        "dirs": packed.dirs,
    }
    return fields, result


def _publish(ctx: JobContext, *, fields: dict[str, object], result: dict[str, object]) -> bool:
    job: Job = ctx.job

    async def write() -> bool:
        async with ctx.runtime.task_session() as session:
            done = await warm_bundles.publish(
                session, job, worker=ctx.worker, fields=fields, result=result
            )
            if done:
                return True
            cancelled = await session.scalar(select(Job.cancel_requested).where(Job.id == job.id))
        if cancelled:
            raise JobCancelled()
        raise JobLost()

    ctx.runtime.run(write())
    ctx.runtime.run(nudge(ctx.runtime, job.id, status="succeeded"))
    log.info("job %s: warm bundle %s published", job.id, uuid.UUID(str(result["bundle_id"])))
    return True
