"""`tensor-registry backfill-layouts`: layout and signed manifests for artifacts published
before them.

Worker code run by an operator as its own process (like `tensor-registry worker`): it reads
every ready artifact's weights from storage once, so it belongs beside the jobs, never in the
API process. Each artifact is one transaction
(``tensor_registry_server.artifacts.making.layout_writer.backfill_layout``: the
object first, the file row after, the resolve cache dropped after commit — through the worker
runtime's sessionmaker, so the API's cached answers in scaled mode are dropped too). An
artifact that fails (its storage unreachable, bytes gone) is reported and skipped; running the
command again picks up what is still missing, and finds nothing to do once all have one.

The signed manifest (``tensor_registry_server.artifacts.making.signatures.backfill_manifest``,
docs/trust.md) follows the
layout in a transaction of its own, so it covers the layout's digest, and a signing failure leaves
the layout (useful on its own) committed. ``model.sig`` (``backfill_model_signature``, the OpenSSF
Model Signing signature) comes third, in a third transaction, over every file the manifest
included; it needs no byte read (the digests are the recorded ones).

Last, every ready artifact's ``model.sig`` whose signed ``ignore_paths`` are not today's (signed
before the node's own files moved into ``.cache/tensor-registry/``, docs/trust.md) is signed
again (``resign_model_signature``: one small object read per artifact, a transaction each); the
report's ``model signatures re-signed: N`` counts them, and a second run finds none.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import exists, select

from tensor_registry.formats.layout import LAYOUT_FILE
from tensor_registry.formats.signed_manifest import MANIFEST_FILE, SIGNATURE_FILE
from tensor_registry_server.artifacts.making.layout_writer import backfill_layout
from tensor_registry_server.artifacts.making.signatures import (
    backfill_manifest,
    backfill_model_signature,
    resign_model_signature,
)
from tensor_registry_server.jobs.runtime import Runtime
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile, ArtifactStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.settings import Settings


@dataclass
class BackfillReport:
    added: list[uuid.UUID] = field(default_factory=list)
    signed: list[uuid.UUID] = field(default_factory=list)
    model_signed: list[uuid.UUID] = field(default_factory=list)
    resigned: list[uuid.UUID] = field(default_factory=list)
    failed: list[tuple[uuid.UUID, str]] = field(default_factory=list)


async def artifacts_without_layout(
    runtime: Runtime, model: str | None = None
) -> list[tuple[uuid.UUID, str]]:
    """(id, storage backend) of every ready artifact lacking its layout, its signed manifest
    or its ``model.sig``, oldest first; ``model`` (NAMESPACE/NAME) narrows to one model."""

    def has(path: str) -> Any:
        return exists().where(ArtifactFile.artifact_id == Artifact.id, ArtifactFile.path == path)

    query = (
        select(Artifact.id, Artifact.storage)
        .where(
            Artifact.status == ArtifactStatus.READY,
            ~(has(LAYOUT_FILE) & has(MANIFEST_FILE) & has(SIGNATURE_FILE)),
        )
        .order_by(Artifact.created_at, Artifact.id)
    )
    if model is not None:
        query = query.join(Model, Model.id == Artifact.model_id).where(Model.name == model)
    async with runtime.task_session() as session:
        return [(row.id, row.storage) for row in (await session.execute(query)).all()]


async def artifacts_with_model_signature(
    runtime: Runtime, model: str | None = None
) -> list[tuple[uuid.UUID, str]]:
    """(id, storage backend) of every ready artifact that has a ``model.sig``, oldest first."""
    query = (
        select(Artifact.id, Artifact.storage)
        .where(
            Artifact.status == ArtifactStatus.READY,
            exists().where(
                ArtifactFile.artifact_id == Artifact.id, ArtifactFile.path == SIGNATURE_FILE
            ),
        )
        .order_by(Artifact.created_at, Artifact.id)
    )
    if model is not None:
        query = query.join(Model, Model.id == Artifact.model_id).where(Model.name == model)
    async with runtime.task_session() as session:
        return [(row.id, row.storage) for row in (await session.execute(query)).all()]


def backfill_layouts(
    settings: Settings,
    *,
    model: str | None = None,
    say: Callable[[str], None] = print,
) -> BackfillReport:
    runtime = Runtime(settings)
    report = BackfillReport()

    def failed(artifact_id: uuid.UUID, exc: Exception) -> None:
        report.failed.append((artifact_id, f"{type(exc).__name__}: {exc}"))
        say(f"artifact {artifact_id}: failed: {type(exc).__name__}: {exc}")

    try:
        todo = runtime.run(artifacts_without_layout(runtime, model))
        say(f"{len(todo)} ready artifact(s) without a layout or signed manifest (or model.sig)")
        for artifact_id, storage in todo:
            started = time.perf_counter()

            async def layout(artifact_id: uuid.UUID = artifact_id, storage: str = storage) -> bool:
                async with runtime.task_session() as session:
                    backend = runtime.storages.get(storage)
                    return await backfill_layout(session, backend, artifact_id)

            async def signed(artifact_id: uuid.UUID = artifact_id, storage: str = storage) -> bool:
                async with runtime.task_session() as session:
                    backend = runtime.storages.get(storage)
                    return await backfill_manifest(session, settings, backend, artifact_id)

            async def oms(artifact_id: uuid.UUID = artifact_id, storage: str = storage) -> bool:
                async with runtime.task_session() as session:
                    backend = runtime.storages.get(storage)
                    return await backfill_model_signature(session, settings, backend, artifact_id)

            try:
                added = runtime.run(layout())
                if added:
                    report.added.append(artifact_id)
                    seconds = time.perf_counter() - started
                    say(f"artifact {artifact_id}: manifest added ({seconds:.1f}s)")
                if runtime.run(signed()):
                    report.signed.append(artifact_id)
                    say(f"artifact {artifact_id}: signed manifest added")
                if runtime.run(oms()):
                    report.model_signed.append(artifact_id)
                    say(f"artifact {artifact_id}: {SIGNATURE_FILE} added")
            except Exception as exc:  # one artifact's failure must not stop the others
                failed(artifact_id, exc)
        for artifact_id, storage in runtime.run(artifacts_with_model_signature(runtime, model)):

            async def resign(artifact_id: uuid.UUID = artifact_id, storage: str = storage) -> bool:
                async with runtime.task_session() as session:
                    backend = runtime.storages.get(storage)
                    return await resign_model_signature(
                        session, settings, backend, runtime.storages, artifact_id
                    )

            try:
                if runtime.run(resign()):
                    report.resigned.append(artifact_id)
                    say(f"artifact {artifact_id}: {SIGNATURE_FILE} signed again (ignore_paths)")
            except Exception as exc:  # one artifact's failure must not stop the others
                failed(artifact_id, exc)
    finally:
        runtime.close()
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m tensor_registry_server.artifacts.making.backfill [--model NS/NAME]`` (what
    ``tensor-registry
    backfill-layouts`` execs): settings from the environment, the report on stdout."""
    import argparse
    import sys

    from tensor_registry_server.core.logs import configure_logging

    parser = argparse.ArgumentParser(
        prog="python -m tensor_registry_server.artifacts.making.backfill"
    )
    parser.add_argument("--model", metavar="NS/NAME", help="only this model's artifacts")
    args = parser.parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_level)
    report = backfill_layouts(
        settings, model=args.model, say=lambda line: print(line, file=sys.stderr, flush=True)
    )
    print(
        f"layout manifests added: {len(report.added)}, "
        f"signed manifests added: {len(report.signed)}, failed: {len(report.failed)}, "
        f"model signatures added: {len(report.model_signed)}, "
        f"model signatures re-signed: {len(report.resigned)}",
        flush=True,
    )
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
