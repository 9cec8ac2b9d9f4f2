"""Resolve: turn (model, ref, filters) into signed URLs and loader settings for a serving node.

``resolve`` is the whole request: check the query and the caller, choose the artifact
(tensor_registry_server.resolve.choice: one indexed statement, cached in Redis in scaled mode by
tensor_registry_server.core.choice_cache), render the answer
(tensor_registry_server.resolve.render: signatures minted per request and
never cached, whole answers memoized for a second by tensor_registry_server.resolve.memo), and
audit. Every resolve
gets an audit row (written behind, in batches: tensor_registry_server.resolve.audit_buffer);
minting a key URL writes a
``key.issue`` row in the request's own transaction, committed before the URL is returned.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core import metrics
from tensor_registry_server.core.choice_cache import ResolveCache, Selection, query_key
from tensor_registry_server.core.errors import Forbidden, Invalid
from tensor_registry_server.models.schemas import validate_name
from tensor_registry_server.resolve import memo
from tensor_registry_server.resolve.audit_buffer import AuditBuffer
from tensor_registry_server.resolve.choice import (
    SessionGetter,
    choose,
    query_filters,
)
from tensor_registry_server.resolve.refs import Ref, parse_ref
from tensor_registry_server.resolve.render import advise_readers, render
from tensor_registry_server.resolve.schemas import ResolveQuery
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry


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
    """Choose, sign, audit. Returns the JSON answer and whether the choice was cached."""
    name, ref, ttl, wants_key = _check_request(principal, q, settings)
    filters = query_filters(q)
    selection, cached = await choose(
        get_session, name, ref, filters, cache=cache, qkey=query_key(name, q.ref, filters)
    )
    # No URLs into a store this process last found down (503 storage_unavailable).
    storages.require_up(selection.storage)
    payload, key_url = await _answer(
        selection,
        q,
        settings=settings,
        storages=storages,
        ttl=ttl,
        wants_key_url=selection.encrypted and wants_key,
    )
    resolve_row: dict[str, Any] = {
        "action": "resolve",
        "actor": principal,
        "target_type": "artifact",
        "target_id": selection.artifact_id,
        "model": selection.model,
        "ref": q.ref,
        "version": selection.version,
        "filters": {k: str(v) if k == "id" else v for k, v in filters.items() if v is not None},
        "cached": cached,
        "ttl": ttl,
        "key_url": key_url is not None,
        "node": q.node,
    }
    model_label = metrics.model_label(selection.model, named=settings.metrics.model_labels)
    cache_state = "off" if cache is None else "hit" if cached else "miss"
    metrics.RESOLVES.labels(model_label, cache_state).inc()
    if key_url is not None:
        metrics.KEY_ISSUES.labels(model_label).inc()
        # Key issue is written in the request's transaction: committed before the URL leaves.
        session = await get_session()
        record(session, **resolve_row)
        _record_key_issue(session, principal, q, selection, key_url=key_url, ttl=ttl)
    elif audit is not None:
        audit.add(**resolve_row)
    else:
        record(await get_session(), **resolve_row)

    return payload, cached


def _check_request(
    principal: Principal, q: ResolveQuery, settings: Settings
) -> tuple[str, Ref, int, bool]:
    """Everything that can refuse the request before any lookup, in the order the caller sees
    the errors: the model name, the caller's namespace, the ref, the ttl, the scope an embedded
    key URL needs. Returns the name, the parsed ref, the URL ttl and whether the caller may
    receive a key URL."""
    try:
        name = validate_name(q.model)
    except ValueError as exc:
        raise Invalid(f"model: {exc}.", code="invalid_model_name") from exc
    principal.require_namespace(name.split("/", 1)[0])
    ref = parse_ref(q.ref)
    ttl = _url_ttl(q, settings)
    if q.embed_key_url and not q.key_url:
        raise Invalid(
            "embed_key_url=true needs the key URL that key_url=false declines.",
            code="conflicting_parameters",
        )
    wants_key = principal.has_scope("keys:read") and q.key_url
    if q.embed_key_url and not wants_key:
        raise Forbidden(
            "embed_key_url needs a token with the 'keys:read' scope.",
            code="insufficient_scope",
            scope="keys:read",
        )
    return name, ref, ttl, wants_key


async def _answer(
    selection: Selection,
    q: ResolveQuery,
    *,
    settings: Settings,
    storages: StorageRegistry,
    ttl: int,
    wants_key_url: bool,
) -> tuple[bytes, str | None]:
    """The rendered answer and its key URL, if any: from the one-second memo
    (tensor_registry_server.resolve.memo), else rendered now."""
    readers = advise_readers(q)
    secret = memo.signing_secret(settings)
    expires_at = int(time.time()) + ttl  # every URL in the answer expires at this second or later
    # The answer is a pure function of these within the second (tensor_registry_server.resolve.memo
    # says why),
    # presigned S3 URLs included: one presign per file per second, not per node.
    memo_key: tuple[Any, ...] = (
        settings.public_base_url,
        secret,
        selection.storage,
        selection.artifact_id,
        selection.model,
        selection.chosen_by,
        q.ref,
        selection.alias_revision,  # the signed binding names the alias's move
        selection.alias_moved_at,
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
    answer = memo.rendered(memo_key)
    if answer is None:
        answer = await render(
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
        memo.remember_rendered(memo_key, answer)
    return answer


def _record_key_issue(
    session: AsyncSession,
    principal: Principal,
    q: ResolveQuery,
    selection: Selection,
    *,
    key_url: str,
    ttl: int,
) -> None:
    """The ``key.issue`` audit row of a key URL in the answer, with the expiry the URL carries
    (what the later ``key.fetch`` rows show)."""
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
