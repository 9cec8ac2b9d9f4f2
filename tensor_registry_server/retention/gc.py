"""Garbage collection by retention policy: plan what may go, then remove it version by version.

The unit is a version with everything under it (its files and its artifacts). A version of a
model that a policy covers stays while any of these holds, and may go otherwise:

- it is among the ``keep_last`` newest ``ready`` versions (so ``latest`` always stays);
- an alias names it now, or named it within ``keep_days`` (alias history: the move to it, or
  the move away from it);
- a node reported one of its artifacts within ``keep_days``: cached or warm in its last
  check-in (if that check-in is that recent), or a load it reported then;
- it is a ``draft`` or ``importing`` (being written), or one of its artifacts is ``pending`` or
  ``running`` (a job is writing it).

``plan`` reads once, without locks, and says for every version why it stays or why it may go.
``remove`` deletes one planned version in its own transaction, and decides again inside it
under the version's row lock (``SELECT … FOR UPDATE``; SQLite: the database write lock taken
first): an alias moved onto it since the plan is seen, and an alias move that starts after the
lock waits for it (the alias's foreign key takes a share lock on the version row) and then
fails, as it would for a version deleted by hand. Bytes go after the commit
(storage.deferred_delete), from whichever backend holds them; what a failed delete leaves
is an orphan for the sweep.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.audit.service import record
from tensor_registry_server.core.db import lock_for_write, session_scope, utcnow
from tensor_registry_server.core.events_outbox import emit, namespace_of
from tensor_registry_server.jobs import transition_events
from tensor_registry_server.jobs.sweep import sweep_orphans
from tensor_registry_server.rows.aliases import Alias, AliasEvent
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile, ArtifactStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.nodes import Node
from tensor_registry_server.rows.retention import RetentionPolicy
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus
from tensor_registry_server.settings import RetentionSettings
from tensor_registry_server.storage.deferred_delete import delete_after_commit
from tensor_registry_server.storage.object_keys import version_prefix
from tensor_registry_server.storage.registry import StorageRegistry

ACTOR = "retention-gc"
log = logging.getLogger("tensor_registry.retention")


@dataclass(frozen=True)
class Policy:
    keep_last: int
    keep_days: float
    # Where it comes from: "model", "namespace" or "settings".
    source: str

    def cutoff(self, now: datetime) -> datetime:
        return now - timedelta(days=self.keep_days)


@dataclass
class Decision:
    """One version: whether it may go, and every reason (why it stays, or why it may go)."""

    model: str
    model_id: str
    version: int
    version_id: str
    status: str
    policy: dict[str, Any]
    remove: bool
    reasons: list[str]
    artifacts: list[str] = field(default_factory=list)
    bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _ModelFacts:
    """What one model's decisions read: its versions, artifacts, aliases and their history."""

    versions: list[Version]
    artifacts: dict[uuid.UUID, list[Artifact]]
    aliases: dict[uuid.UUID, list[str]]
    # version number → (alias, when) of the newest move to or away from it since the cutoff.
    named: dict[int, tuple[str, datetime]]


async def policies(
    session: AsyncSession, settings: RetentionSettings
) -> tuple[dict[uuid.UUID, Policy], dict[str, Policy], Policy | None]:
    """(per model id, per namespace, the settings' default)."""
    per_model: dict[uuid.UUID, Policy] = {}
    per_namespace: dict[str, Policy] = {}
    for row in (await session.execute(select(RetentionPolicy))).scalars():
        if row.model_id is not None:
            per_model[row.model_id] = Policy(row.keep_last, row.keep_days, "model")
        else:
            per_namespace[row.namespace] = Policy(row.keep_last, row.keep_days, "namespace")
    default = (
        Policy(settings.default_keep_last, settings.default_keep_days, "settings")
        if settings.default_keep_last is not None
        else None
    )
    return per_model, per_namespace, default


async def node_reports(session: AsyncSession) -> dict[str, datetime]:
    """Artifact id → when a node last reported holding (cached, warm) or loading it."""
    reports: dict[str, datetime] = {}

    def saw(artifact_id: Any, when: datetime) -> None:
        if isinstance(artifact_id, str) and artifact_id and reports.get(artifact_id, when) <= when:
            reports[artifact_id] = when

    rows = await session.execute(select(Node.last_seen_at, Node.cached, Node.watches, Node.loaded))
    for last_seen_at, cached, watches, loaded in rows:
        for artifact_id in cached or []:
            saw(artifact_id, last_seen_at)
        for watch in watches or []:
            if watch.get("state") == "warm":
                saw(watch.get("artifact_id"), last_seen_at)
        for load in loaded or []:
            try:
                when = datetime.fromisoformat(str(load.get("reported_at")))
            except ValueError:
                when = last_seen_at
            saw(load.get("artifact_id"), min(when, last_seen_at))
    return reports


async def _model_facts(session: AsyncSession, model_id: uuid.UUID, since: datetime) -> _ModelFacts:
    versions = list(
        (
            await session.execute(
                select(Version).where(Version.model_id == model_id).order_by(Version.number.desc())
            )
        ).scalars()
    )
    artifacts: dict[uuid.UUID, list[Artifact]] = {}
    for artifact in (
        await session.execute(select(Artifact).where(Artifact.model_id == model_id))
    ).scalars():
        artifacts.setdefault(artifact.version_id, []).append(artifact)
    aliases: dict[uuid.UUID, list[str]] = {}
    for name, version_id in await session.execute(
        select(Alias.name, Alias.version_id).where(Alias.model_id == model_id)
    ):
        aliases.setdefault(version_id, []).append(name)
    named: dict[int, tuple[str, datetime]] = {}
    events = await session.execute(
        select(
            AliasEvent.alias, AliasEvent.from_version, AliasEvent.to_version, AliasEvent.created_at
        )
        .where(AliasEvent.model_id == model_id, AliasEvent.created_at >= since)
        .order_by(AliasEvent.created_at)
    )
    for alias, from_version, to_version, created_at in events:
        for number in (from_version, to_version):
            if number is not None:
                named[number] = (alias, created_at)
    return _ModelFacts(versions, artifacts, aliases, named)


def _reasons(
    version: Version,
    rank: int | None,
    facts: _ModelFacts,
    reports: dict[str, datetime],
    policy: Policy,
    now: datetime,
) -> tuple[bool, list[str]]:
    """(may go, reasons): every reason it stays, or the one sentence why it may go."""
    days = f"{policy.keep_days:g} days"
    keep: list[str] = []
    if version.status in (VersionStatus.DRAFT, VersionStatus.IMPORTING):
        keep.append(f"it is {version.status} (being written)")
    if rank is not None and rank < policy.keep_last:
        keep.append(f"among the newest {policy.keep_last} ready version(s)")
    for name in sorted(facts.aliases.get(version.id, [])):
        keep.append(f"alias '{name}' points at it")
    if version.number in facts.named:
        alias, when = facts.named[version.number]
        keep.append(f"alias '{alias}' named it at {when.isoformat()} (within {days})")
    cutoff = policy.cutoff(now)
    for artifact in facts.artifacts.get(version.id, []):
        if artifact.status in (ArtifactStatus.PENDING, ArtifactStatus.RUNNING):
            keep.append(f"artifact {artifact.id} is {artifact.status}")
        reported = reports.get(str(artifact.id))
        if reported is not None and reported >= cutoff:
            keep.append(
                f"a node reported artifact {artifact.id} at {reported.isoformat()} (within {days})"
            )
    if keep:
        return False, keep
    return True, [
        f"not among the newest {policy.keep_last} ready version(s); no alias names it or named "
        f"it within {days}; no node reported its artifacts within {days}"
    ]


def _ranks(facts: _ModelFacts) -> dict[uuid.UUID, int]:
    ready = [v for v in facts.versions if v.status == VersionStatus.READY]
    return {v.id: i for i, v in enumerate(ready)}


async def _sizes(session: AsyncSession, version_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    sizes: dict[uuid.UUID, int] = dict.fromkeys(version_ids, 0)
    if not version_ids:
        return sizes
    for version_id, total in await session.execute(
        select(VersionFile.version_id, func.sum(VersionFile.size))
        .where(VersionFile.version_id.in_(version_ids))
        .group_by(VersionFile.version_id)
    ):
        sizes[version_id] += int(total or 0)
    for version_id, total in await session.execute(
        select(Artifact.version_id, func.sum(ArtifactFile.size))
        .join(ArtifactFile, ArtifactFile.artifact_id == Artifact.id)
        .where(Artifact.version_id.in_(version_ids))
        .group_by(Artifact.version_id)
    ):
        sizes[version_id] += int(total or 0)
    return sizes


async def plan(
    session: AsyncSession, settings: RetentionSettings, *, now: datetime | None = None
) -> list[Decision]:
    """A decision for every version of every model a policy covers (models without one are
    left out: nothing of theirs ever goes)."""
    now = now or utcnow()
    per_model, per_namespace, default = await policies(session, settings)
    if not (per_model or per_namespace or default):
        return []
    reports = await node_reports(session)
    decisions: list[Decision] = []
    models = (await session.execute(select(Model).order_by(Model.name))).scalars().all()
    for model in models:
        policy = per_model.get(model.id) or per_namespace.get(model.namespace) or default
        if policy is None:
            continue
        facts = await _model_facts(session, model.id, policy.cutoff(now))
        ranks = _ranks(facts)
        sizes = await _sizes(session, [v.id for v in facts.versions])
        for version in sorted(facts.versions, key=lambda v: v.number):
            remove, reasons = _reasons(version, ranks.get(version.id), facts, reports, policy, now)
            decisions.append(
                Decision(
                    model=model.name,
                    model_id=str(model.id),
                    version=version.number,
                    version_id=str(version.id),
                    status=version.status,
                    policy=asdict(policy),
                    remove=remove,
                    reasons=reasons,
                    artifacts=[str(a.id) for a in facts.artifacts.get(version.id, [])],
                    bytes=sizes.get(version.id, 0),
                )
            )
    return decisions


async def remove(
    sessionmaker: async_sessionmaker[AsyncSession],
    storages: StorageRegistry,
    settings: RetentionSettings,
    decision: Decision,
    *,
    now: datetime | None = None,
) -> Decision:
    """Remove one planned version if it may still go, deciding again under its row lock.
    Returns the decision as it stands after (``remove`` False and the reasons it stayed, if
    something changed since the plan)."""
    now = now or utcnow()
    version_id = uuid.UUID(decision.version_id)
    async with session_scope(sessionmaker) as session:
        await lock_for_write(session)
        version = (
            await session.execute(select(Version).where(Version.id == version_id).with_for_update())
        ).scalar_one_or_none()
        if version is None:
            return _changed(decision, ["already gone"])
        model = await session.get(Model, version.model_id)
        assert model is not None  # the version row is locked; its model cannot go under it
        per_model, per_namespace, default = await policies(session, settings)
        policy = per_model.get(model.id) or per_namespace.get(model.namespace) or default
        if policy is None:
            return _changed(decision, ["no retention policy covers it any more"])
        facts = await _model_facts(session, model.id, policy.cutoff(now))
        remove_it, reasons = _reasons(
            version, _ranks(facts).get(version.id), facts, await node_reports(session), policy, now
        )
        if not remove_it:
            return _changed(decision, reasons)
        await _delete(session, storages, model, version, policy, reasons)
    return decision


def _changed(decision: Decision, reasons: list[str]) -> Decision:
    return Decision(
        **{**decision.as_json(), "remove": False, "reasons": ["kept on re-check", *reasons]}
    )


async def _delete(
    session: AsyncSession,
    storages: StorageRegistry,
    model: Model,
    version: Version,
    policy: Policy,
    reasons: list[str],
) -> None:
    artifacts = await transition_events.announce_artifacts_deleted(
        session, model.name, Artifact.version_id == version.id
    )
    for artifact in artifacts:
        _audit(
            record(
                session,
                action="artifact.delete",
                actor=None,
                target_type="artifact",
                target_id=artifact.id,
                model=model.name,
                version=version.number,
                dtype=artifact.dtype,
                format=artifact.format,
                reason="retention",
            )
        )
    emit(
        session,
        "version.deleted",
        namespace=namespace_of(model.name),
        data={
            "model": model.name,
            "model_id": str(model.id),
            "version": version.number,
            "artifact_ids": [str(a.id) for a in artifacts],
            "reason": "retention",
        },
    )
    _audit(
        record(
            session,
            action="version.delete",
            actor=None,
            target_type="version",
            target_id=version.id,
            model=model.name,
            version=version.number,
            reason="retention",
            policy=asdict(policy),
            why=reasons,
        )
    )
    prefixes = [(version.storage, version_prefix(version.id))]
    prefixes += [(a.storage, a.storage_prefix) for a in artifacts]
    await session.delete(version)
    await session.flush()
    for storage_name, prefix in prefixes:
        delete_after_commit(
            session, storages, storage_name, prefix if prefix.endswith("/") else prefix + "/"
        )


def _audit(event: Any) -> None:
    # No token acted: the audit row names the collector.
    event.actor_name = ACTOR


@dataclass
class Report:
    """One run: every decision (after re-checks), and the orphaned objects found."""

    dry_run: bool
    decisions: list[Decision]
    orphans: list[str]

    @property
    def removed(self) -> list[Decision]:
        return [d for d in self.decisions if d.remove]

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed" if not self.dry_run else "would_remove": [d.as_json() for d in self.removed],
            "kept": [d.as_json() for d in self.decisions if not d.remove],
            "orphans": self.orphans,
            "bytes": sum(d.bytes for d in self.removed),
        }


async def collect(
    sessionmaker: async_sessionmaker[AsyncSession],
    storages: StorageRegistry,
    settings: RetentionSettings,
    *,
    dry_run: bool,
    orphan_grace: timedelta,
    sweep: bool = True,
    now: datetime | None = None,
) -> Report:
    """Plan, then (unless ``dry_run``) remove what may go, then (if ``sweep``) sweep orphaned
    objects older than ``orphan_grace`` (tensor_registry_server.jobs.sweep)."""
    async with sessionmaker() as session:
        decisions = await plan(session, settings, now=now)
    if not dry_run:
        decisions = [
            await remove(sessionmaker, storages, settings, d, now=now) if d.remove else d
            for d in decisions
        ]
    orphans: list[str] = []
    if sweep:
        await sweep_orphans(
            sessionmaker,
            storages,
            older_than=orphan_grace,
            dry_run=dry_run,
            found=orphans,
            now=now,
        )
    for decision in decisions:
        if decision.remove and not dry_run:
            log.info(
                "retention removed %s v%d (%d bytes): %s",
                decision.model,
                decision.version,
                decision.bytes,
                decision.reasons[0],
            )
    return Report(dry_run=dry_run, decisions=decisions, orphans=orphans)
