"""Resolve: turn (model, ref, filters) into signed URLs and loader settings for a serving node.

The choice of artifact is one indexed statement (models → versions → newest matching ready
artifact → its files), cached in Redis in scaled mode (app.resolve.cache). Signatures are minted
per request and never cached. Every resolve gets an audit row (written behind, in batches:
app.resolve.audit_buffer); minting a key URL writes a ``key.issue`` row in the request's own
transaction, committed before the URL is returned.

Decisions where the contract is silent:
- ``latest`` is the highest *ready version*, as API.md defines it, even when that version lacks
  the requested variant: then the answer is 404 ``no_matching_artifact`` listing the variants
  it has and the versions that do have a match. Falling back to an older version would let
  nodes with different filters silently run different versions during a rollout.
- Among several matching ready artifacts of the version the most recently created wins.
- ``deserializer.num_readers`` defaults to 4: tensorizer's own choice when hashes are verified,
  and a load a registry serving many nodes over HTTP can carry. Nodes that can do more say so
  (``num_readers`` or ``cpu_count``: half the CPUs, 1..16).
- ``verify_hash`` is advised on: it is the one check that catches a proxy or server answering
  a Range request with the wrong bytes, and storage corruption, before the weights are used.
  It costs CPU (H200 node, 16 readers, bench/results/serving.md: 30.8 → 6.8 GB/s from a local
  file, 20.0 → 6.3 GB/s through the client over loopback HTTP); nodes that trust their path
  can ask for ``verify_hash=false``.
- The vllm block carries no key material and no key capability unless asked for
  (``embed_key_url``): vLLM logs ``model_loader_extra_config``. By default
  ``encryption_keyfile`` names a local file that ``tensor-registry pull`` writes (mode 0600)
  from ``encryption_key_url``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app import metrics
from app.aliases.schemas import ALIAS_RE
from app.aliases.tables import Alias
from app.artifacts.tables import Artifact, ArtifactFile, ArtifactStatus
from app.audit.service import record
from app.auth import Principal
from app.client.manifest import MANIFEST_FILE, compatibility_key
from app.errors import AppError, Forbidden, Invalid, NotFound
from app.models.schemas import validate_name
from app.models.tables import Model
from app.resolve.advice import engine_advice, file_kind
from app.resolve.audit_buffer import AuditBuffer
from app.resolve.cache import CachedFile, Lookup, ResolveCache, Selection, query_key
from app.resolve.schemas import ResolveQuery
from app.settings import Settings
from app.storage import signing
from app.storage.base import Storage
from app.storage.registry import StorageRegistry
from app.versions.tables import Version, VersionStatus

# One encoder for the hot path (json.dumps with options builds a new one per call).
compact_json = json.JSONEncoder(separators=(",", ":")).encode

DEFAULT_NUM_READERS = 4
MAX_ADVISED_READERS = 16
WEIGHTS_SUFFIX = ".tensors"
SINGLE_FILE = "model.tensors"
RANK_TEMPLATE = "model-rank-%03d.tensors"
_MAX_VERSION = 2**31 - 1


@dataclass(frozen=True)
class Ref:
    kind: str  # "latest" | "version" | "alias"
    number: int | None = None
    alias: str | None = None


def parse_ref(ref: str) -> Ref:
    if ref == "latest":
        return Ref("latest")
    if ref.isdigit():
        number = int(ref)
        if 1 <= number <= _MAX_VERSION:
            return Ref("version", number=number)
    elif ALIAS_RE.match(ref):
        return Ref("alias", alias=ref)
    raise Invalid(
        f"ref {ref!r} is not 'latest', a version number or an alias name.", code="invalid_ref"
    )


CHOICE_ORDER = (
    "the filters given (dtype, format, tensor_parallel_size, encrypted) must match; then "
    "unencrypted before encrypted; then the newest"
)


def _filters(q: ResolveQuery) -> dict[str, Any]:
    return {
        "dtype": q.dtype,
        "format": q.format,
        "tensor_parallel_size": q.tensor_parallel_size,
        "encrypted": q.encrypted,
    }


def _artifact_filters(entity: Any, filters: dict[str, Any]) -> list[Any]:
    return [getattr(entity, name) == value for name, value in filters.items() if value is not None]


def _choice_statement(name: str, ref: Ref, filters: dict[str, Any]) -> Any:
    """The hot-path query: one row per file of the chosen artifact (none when nothing matches).

    The choice (CHOICE_ORDER): the filters given are hard constraints; among the ready
    artifacts of the version that match, unencrypted before encrypted, then the newest. So
    adding an encrypted variant never changes what a resolve without ``encrypted=`` returns,
    and a caller without ``keys:read`` gets a plain artifact whenever one matches.
    """
    newer = aliased(Artifact)
    newest_match = (
        select(newer.id)
        .where(
            newer.version_id == Version.id,
            newer.status == ArtifactStatus.READY,
            *_artifact_filters(newer, filters),
        )
        .order_by(newer.encrypted.asc(), newer.created_at.desc(), newer.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    stmt = (
        select(
            Model.id,
            Model.name,
            Model.namespace,
            Version.number,
            Artifact.id,
            Artifact.dtype,
            Artifact.format,
            Artifact.tensor_parallel_size,
            Artifact.encrypted,
            Artifact.key_id,
            Artifact.encryption_algorithm,
            Artifact.storage,
            Artifact.storage_prefix,
            Artifact.tensorizer_version,
            ArtifactFile.path,
            ArtifactFile.size,
            ArtifactFile.sha256,
            ArtifactFile.storage_key,
            Artifact.stats["compatibility_key"].as_string(),
        )
        .select_from(Model)
        .join(Version, Version.model_id == Model.id)
        .join(Artifact, Artifact.id == newest_match)
        .join(ArtifactFile, ArtifactFile.artifact_id == Artifact.id)
        .where(Model.name == name, Version.status == VersionStatus.READY)
        .order_by(ArtifactFile.path)
    )
    if ref.kind == "version":
        stmt = stmt.where(Version.number == ref.number)
    elif ref.kind == "alias":
        stmt = stmt.where(
            Version.id
            == select(Alias.version_id)
            .where(Alias.model_id == Model.id, Alias.name == ref.alias)
            .scalar_subquery()
        )
    else:
        highest = aliased(Version)
        stmt = stmt.where(
            Version.number
            == select(func.max(highest.number))
            .where(highest.model_id == Model.id, highest.status == VersionStatus.READY)
            .scalar_subquery()
        )
    return stmt


def _selection(rows: Sequence[Any]) -> Selection:
    first = rows[0]
    return Selection(
        model_id=str(first[0]),
        model=first[1],
        namespace=first[2],
        version=first[3],
        artifact_id=str(first[4]),
        dtype=first[5],
        format=first[6],
        tensor_parallel_size=first[7],
        encrypted=bool(first[8]),
        key_id=first[9],
        encryption_algorithm=first[10],
        storage=first[11],
        storage_prefix=first[12],
        tensorizer_version=first[13],
        files=tuple(
            CachedFile(path=r[14], size=int(r[15]), sha256=r[16], storage_key=r[17]) for r in rows
        ),
        compatibility_key=first[18],
    )


SessionGetter = Callable[[], Awaitable[AsyncSession]]


async def choose(
    get_session: SessionGetter,
    name: str,
    ref: Ref,
    filters: dict[str, Any],
    *,
    cache: ResolveCache | None,
    qkey: str,
) -> tuple[Selection, bool]:
    """The chosen artifact and whether it came from the cache."""
    lookup = await cache.lookup(name, qkey) if cache is not None else None
    if lookup is not None and lookup.selection is not None:
        return lookup.selection, True
    session = await get_session()
    rows = (await session.execute(_choice_statement(name, ref, filters))).all()
    if not rows:
        await _explain_miss(session, name, ref, filters)
    selection = _selection(rows)
    if cache is not None:
        await cache.store(lookup or Lookup(None, None, None), qkey, selection)
    return selection, False


async def _explain_miss(
    session: AsyncSession, name: str, ref: Ref, filters: dict[str, Any]
) -> NoReturn:
    """Off the hot path: say precisely why nothing matched, listing what exists."""
    model_id = await session.scalar(select(Model.id).where(Model.name == name))
    if model_id is None:
        raise NotFound(f"No model named '{name}'.", code="model_not_found")
    version_row: Any  # (id, number, status) or None
    if ref.kind == "alias":
        version_row = (
            await session.execute(
                select(Version.id, Version.number, Version.status)
                .join(Alias, Alias.version_id == Version.id)
                .where(Alias.model_id == model_id, Alias.name == ref.alias)
            )
        ).first()
        if version_row is None:
            raise NotFound(f"Model '{name}' has no alias '{ref.alias}'.", code="alias_not_found")
    elif ref.kind == "version":
        version_row = (
            await session.execute(
                select(Version.id, Version.number, Version.status).where(
                    Version.model_id == model_id, Version.number == ref.number
                )
            )
        ).first()
        if version_row is None:
            raise NotFound(f"Model '{name}' has no version {ref.number}.", code="version_not_found")
    else:
        version_row = (
            await session.execute(
                select(Version.id, Version.number, Version.status)
                .where(Version.model_id == model_id, Version.status == VersionStatus.READY)
                .order_by(Version.number.desc())
                .limit(1)
            )
        ).first()
    available: list[dict[str, Any]] = []
    if version_row is not None:
        artifacts = (
            await session.execute(
                select(
                    Artifact.dtype,
                    Artifact.format,
                    Artifact.tensor_parallel_size,
                    Artifact.encrypted,
                    Artifact.status,
                )
                .where(Artifact.version_id == version_row[0])
                .order_by(Artifact.created_at.desc())
            )
        ).all()
        available = [
            {
                "version": version_row[1],
                "dtype": a[0],
                "format": a[1],
                "tensor_parallel_size": a[2],
                "encrypted": bool(a[3]),
                "status": a[4],
            }
            for a in artifacts
        ]
    matching_versions = list(
        (
            await session.execute(
                select(Version.number)
                .join(Artifact, Artifact.version_id == Version.id)
                .where(
                    Version.model_id == model_id,
                    Version.status == VersionStatus.READY,
                    Artifact.status == ArtifactStatus.READY,
                    *_artifact_filters(Artifact, filters),
                )
                .group_by(Version.number)
                .order_by(Version.number.desc())
                .limit(10)
            )
        ).scalars()
    )
    wanted = ", ".join(f"{k}={v}" for k, v in filters.items() if v is not None) or "any variant"
    if version_row is None:
        where = f"'{name}' has no ready version"
    elif version_row[2] != VersionStatus.READY:
        where = f"version {version_row[1]} of '{name}' is {version_row[2]}"
    else:
        where = f"version {version_row[1]} of '{name}' has no ready artifact with {wanted}"
    raise NotFound(
        f"Nothing to resolve: {where}. (How resolve chooses: {CHOICE_ORDER}.)",
        code="no_matching_artifact",
        title="No matching artifact",
        version=version_row[1] if version_row is not None else None,
        available=available,
        versions_with_match=matching_versions,
    )


_secrets: dict[int, tuple[Settings, bytes]] = {}


def signing_secret(settings: Settings) -> bytes:
    """``settings.signing_key_bytes()``, remembered per Settings object (it stats a file)."""
    known = _secrets.get(id(settings))
    if known is None or known[0] is not settings:
        if len(_secrets) > 64:
            _secrets.clear()
        known = _secrets[id(settings)] = (settings, settings.signing_key_bytes())
    return known[1]


def advise_readers(q: ResolveQuery) -> int:
    if q.num_readers is not None:
        return q.num_readers
    if q.cpu_count is not None:
        return max(1, min(MAX_ADVISED_READERS, q.cpu_count // 2))
    return DEFAULT_NUM_READERS


def _url_ttl(q: ResolveQuery, settings: Settings) -> int:
    ttl = q.ttl if q.ttl is not None else settings.security.default_url_ttl_seconds
    ceiling = settings.security.max_url_ttl_seconds
    if ttl > ceiling:
        raise Invalid(
            f"ttl {ttl} is longer than the {ceiling} seconds this registry allows.",
            code="ttl_too_long",
            max_ttl=ceiling,
        )
    return ttl


def _direct_urls(storages: StorageRegistry, storage: str) -> Any:
    """The backend's ``download_url`` when it overrides the base (presigned S3), else None."""
    backend = storages.get(storage)
    direct = getattr(type(backend), "download_url", None)
    if direct is None or direct is getattr(Storage, "download_url", None):
        return None
    return backend.download_url


async def _file_urls(
    storages: StorageRegistry,
    settings: Settings,
    secret: bytes,
    selection: Selection,
    ttl: int,
) -> list[str]:
    # Backends that can hand out their own short-lived GET (presigned S3) do so; everything
    # else (the local directory, Redis) is served by the registry's signed blob route.
    direct = _direct_urls(storages, selection.storage)
    urls: list[str] = []
    signed: tuple[str, str, str] | None = None  # (scope, URL up to the key, query)
    for f in selection.files:
        url = await direct(f.storage_key, ttl) if direct is not None else None
        if url:
            urls.append(str(url))
            continue
        # A blob signature covers the artifact's whole prefix (signing.blob_scope), so one
        # signature serves every file: sign once, then only the key in the path differs.
        scope = signing.blob_scope(f.storage_key)
        if signed is None or signed[0] != scope:
            first = signing.blob_url(
                settings.public_base_url,
                secret,
                storage=selection.storage,
                key=f.storage_key,
                ttl=ttl,
            )
            head, _, query = first.partition("?")
            signed = (scope, head[: len(head) - len(f.storage_key)], query)
        urls.append(f"{signed[1]}{f.storage_key}?{signed[2]}")
    return urls


def _weights(selection: Selection) -> list[CachedFile]:
    """Rank-ordered weight files, checked against the layout vLLM expects."""
    by_path = {f.path: f for f in selection.files}
    tp = selection.tensor_parallel_size
    names = [SINGLE_FILE] if tp == 1 else [RANK_TEMPLATE % rank for rank in range(tp)]
    missing = [n for n in names if n not in by_path]
    if missing:
        raise AppError(
            f"Artifact {selection.artifact_id} is ready but lacks {', '.join(missing)}.",
            code="artifact_layout_invalid",
        )
    return [by_path[n] for n in names]


def _template_key(rank_files: list[CachedFile]) -> str:
    directory = rank_files[0].storage_key.rpartition("/")[0]
    template = f"{directory}/{RANK_TEMPLATE}" if directory else RANK_TEMPLATE
    if any(template % rank != f.storage_key for rank, f in enumerate(rank_files)):
        raise AppError(
            "The rank files of this artifact are not stored side by side, so no %03d "
            "template can address them.",
            code="artifact_layout_invalid",
        )
    return template


async def resolve(
    get_session: SessionGetter,
    principal: Principal,
    q: ResolveQuery,
    *,
    settings: Settings,
    storages: StorageRegistry,
    cache: ResolveCache | None,
    audit: AuditBuffer | None,
) -> tuple[bytes, bool]:
    """Choose, sign, audit. Returns the JSON answer and whether the choice was cached.

    The answer is built as plain data and encoded here (tests validate it against ResolveOut):
    on the hot path, validating our own output would cost as much as the lookup.
    """
    try:
        name = validate_name(q.model)
    except ValueError as exc:
        raise Invalid(f"model: {exc}.", code="invalid_model_name") from exc
    principal.require_namespace(name.split("/", 1)[0])
    ref = parse_ref(q.ref)
    ttl = _url_ttl(q, settings)
    wants_key = principal.has_scope("keys:read")
    if q.embed_key_url and not wants_key:
        raise Forbidden(
            "embed_key_url needs a token with the 'keys:read' scope.",
            code="insufficient_scope",
            scope="keys:read",
        )
    filters = _filters(q)
    selection, cached = await choose(
        get_session, name, ref, filters, cache=cache, qkey=query_key(name, q.ref, filters)
    )

    readers = advise_readers(q)
    secret = signing_secret(settings)
    expires_at = int(time.time()) + ttl  # every URL in the answer expires at this second or later
    wants_key_url = selection.encrypted and wants_key
    memo_key = None
    if _direct_urls(storages, selection.storage) is None:
        # The answer is a pure function of these (signatures included: same exp, same HMAC),
        # so within one second every node asking the same question gets the same bytes.
        memo_key = (
            settings.public_base_url,
            secret,
            selection.artifact_id,
            selection.model,
            q.ref,
            ttl,
            expires_at,
            readers,
            q.cpu_count,
            q.gpu,
            q.verify_hash,
            q.keyfile,
            q.embed_key_url,
            wants_key_url,
        )
    rendered = _rendered.get(memo_key) if memo_key is not None else None
    if rendered is None:
        rendered = await _render(
            selection,
            q,
            storages=storages,
            settings=settings,
            secret=secret,
            ttl=ttl,
            expires_at=expires_at,
            readers=readers,
            wants_key_url=wants_key_url,
        )
        if memo_key is not None:
            if len(_rendered) >= _RENDERED_LIMIT:
                _rendered.clear()
            _rendered[memo_key] = rendered
    payload, key_url = rendered

    resolve_row: dict[str, Any] = {
        "action": "resolve",
        "actor": principal,
        "target_type": "artifact",
        "target_id": selection.artifact_id,
        "model": selection.model,
        "ref": q.ref,
        "version": selection.version,
        "filters": {k: v for k, v in filters.items() if v is not None},
        "cached": cached,
        "ttl": ttl,
        "key_url": key_url is not None,
        "node": q.node,
    }
    model_label = metrics.model_label(selection.model)
    cache_state = "off" if cache is None else "hit" if cached else "miss"
    metrics.RESOLVES.labels(model_label, cache_state).inc()
    if key_url is not None:
        metrics.KEY_ISSUES.labels(model_label).inc()
        # Key issue is written in the request's transaction: committed before the URL leaves.
        session = await get_session()
        record(session, **resolve_row)
        record(
            session,
            action="key.issue",
            actor=principal,
            target_type="artifact",
            target_id=selection.artifact_id,
            model=selection.model,
            version=selection.version,
            key_id=selection.key_id,
            exp=int(parse_qs(urlsplit(key_url).query)["exp"][0]),  # what key.fetch rows show
            ttl=ttl,
            embedded_in_vllm_config=bool(q.embed_key_url),
            node=q.node,
        )
    elif audit is not None:
        audit.add(**resolve_row)
    else:
        record(await get_session(), **resolve_row)

    return payload, cached


def legacy_compatibility_key(selection: Selection) -> str:
    """The key of an artifact published before keys were recorded: from what its rows hold
    (the config.json digest stands in for the architecture and quantization it contains)."""
    config = next((f.sha256 for f in selection.files if f.path == "config.json"), None)
    return compatibility_key(
        architecture=None,
        config_sha256=config,
        dtype=selection.dtype,
        format=selection.format,
        tensor_parallel_size=selection.tensor_parallel_size,
    )


_rendered: dict[tuple[Any, ...], tuple[bytes, str | None]] = {}
_RENDERED_LIMIT = 256


async def _render(
    selection: Selection,
    q: ResolveQuery,
    *,
    storages: StorageRegistry,
    settings: Settings,
    secret: bytes,
    ttl: int,
    expires_at: int,
    readers: int,
    wants_key_url: bool,
) -> tuple[bytes, str | None]:
    """The JSON answer (ResolveOut) and the key URL in it, if any."""
    weights = _weights(selection)
    urls = await _file_urls(storages, settings, secret, selection, ttl)
    files = [
        {
            "path": f.path,
            "size": f.size,
            "sha256": f.sha256,
            "url": url,
            "kind": file_kind(f.path, WEIGHTS_SUFFIX),
        }
        for f, url in zip(selection.files, urls, strict=True)
    ]
    if selection.tensor_parallel_size == 1:
        tensorizer_uri = next(f["url"] for f in files if f["path"] == weights[0].path)
        rank_uris = [tensorizer_uri]
    else:
        tensorizer_uri = signing.blob_url(
            settings.public_base_url,
            secret,
            storage=selection.storage,
            key=_template_key(weights),
            ttl=ttl,
        )
        rank_uris = [tensorizer_uri % rank for rank in range(selection.tensor_parallel_size)]

    key_url = None
    if wants_key_url:
        key_url = signing.key_url(
            settings.public_base_url, secret, artifact_id=selection.artifact_id, ttl=ttl
        )

    extra: dict[str, Any] = {
        "tensorizer_uri": tensorizer_uri,
        "num_readers": readers,
        "verify_hash": q.verify_hash,
    }
    keyfile = None
    if selection.encrypted:
        if q.embed_key_url and key_url is not None:
            keyfile = {"path": key_url, "source": "url"}
        else:
            keyfile = {"path": q.keyfile, "source": "file"}
        extra["encryption_keyfile"] = keyfile["path"]
    args = [
        "--load-format",
        "tensorizer",
        "--model-loader-extra-config",
        compact_json(extra),
    ]
    if selection.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(selection.tensor_parallel_size)]

    body = {
        "model": selection.model,
        "ref": q.ref,
        "version": selection.version,
        "artifact": {
            "id": selection.artifact_id,
            "model_id": selection.model_id,
            "version": selection.version,
            "dtype": selection.dtype,
            "format": selection.format,
            "tensor_parallel_size": selection.tensor_parallel_size,
            "encryption": {
                "enabled": selection.encrypted,
                "key_id": selection.key_id,
                "algorithm": selection.encryption_algorithm,
            },
            "storage": selection.storage,
            "tensorizer_version": selection.tensorizer_version,
        },
        "compatibility_key": selection.compatibility_key or legacy_compatibility_key(selection),
        "manifest_path": (
            MANIFEST_FILE if any(f.path == MANIFEST_FILE for f in selection.files) else None
        ),
        "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat().replace("+00:00", "Z"),
        "files": files,
        "tensorizer_uri": tensorizer_uri,
        "tensorizer_uris": rank_uris,
        "encryption_key_url": key_url,
        "deserializer": {"num_readers": readers, "verify_hash": q.verify_hash},
        "engine": engine_advice(
            paths=[f.path for f in selection.files],
            encrypted=selection.encrypted,
            cpu_count=q.cpu_count,
            gpu=q.gpu,
            verify=q.verify_hash,
        ),
        "vllm": {"model_loader_extra_config": extra, "args": args, "keyfile": keyfile},
    }
    return compact_json(body).encode(), key_url
