"""The resolve cache (Redis, scaled mode): which artifact a (model, ref, filters) query picks.

What is cached is the *choice* — artifact id, version, variant, file list with sizes, sha256s
and storage keys — never a signed URL, a key URL or key material: those are minted per request.

Invalidation is a per-model generation counter, ``<prefix>gen:<model_id>``, bumped after every
commit that changed a row of the models, versions, aliases or artifacts tables
(``tensor_registry_server.core.invalidation``, driven by the session's flushes). An entry is
stamped with the
generation read *before* the database query that produced it, so a write that commits while
the query runs leaves an entry that is already stale-by-generation and is never served. Entries
also expire after ``broker.resolve_cache_ttl_seconds``, a backstop for a writer that could not
reach Redis.

Entries are keyed by model id; the name → id map is kept in process (a model's id never changes
for its name; a deleted and re-created model has a new id, which the miss path notices). A hit
is one Redis round trip (MGET of the generation and the entry). Redis trouble never fails a
resolve: the cache is skipped and the database answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tensor_registry_server.core.invalidation import bind_invalidator

log = logging.getLogger("tensor_registry.resolve.cache")

# Key under which a sessionmaker carries the cache into every session's ``info``.
SESSION_INFO_KEY = "resolve_cache"
DEFAULT_PREFIX = "trg:resolve:v1:"
# Generation keys outlive every entry by far; see ``invalidate``.
_GENERATION_TTL_SECONDS = 7 * 24 * 3600
_NAME_MAP_LIMIT = 10_000


@dataclass(frozen=True)
class CachedFile:
    path: str
    size: int
    sha256: str
    storage_key: str


@dataclass(frozen=True)
class Selection:
    """The outcome of choosing an artifact: everything resolve needs except fresh signatures."""

    model_id: str
    model: str
    namespace: str
    version: int
    artifact_id: str
    dtype: str
    format: str
    tensor_parallel_size: int
    encrypted: bool
    key_id: str | None
    encryption_algorithm: str | None
    storage: str
    storage_prefix: str
    tensorizer_version: str | None
    files: tuple[CachedFile, ...]
    # Recorded at publish (tensor_registry/formats/signed_manifest.py); None for artifacts
    # signed before it.
    compatibility_key: str | None = None
    # Which rule chose the variant (tensor_registry_server.resolve.choice.CHOSEN_BY).
    chosen_by: str = "newest"
    # An alias ref: the alias's revision (counts its moves) and when it last moved, signed
    # into the answer's binding.
    alias_revision: int | None = None
    alias_moved_at: str | None = None
    # The artifact's ready warm bundles, newest first (docs/warm-state.md): id, storage_key,
    # size, sha256, key, cache, statement, created_at.
    warm_bundles: tuple[dict[str, Any], ...] = ()
    # The version's executable content (auto_map and *.py files), None when it carries none.
    remote_code: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Selection:
        data = json.loads(raw)
        data["files"] = tuple(CachedFile(**f) for f in data["files"])
        data["warm_bundles"] = tuple(data.get("warm_bundles") or ())
        return cls(**data)


@dataclass(frozen=True)
class Lookup:
    """A cache read: the hit, or the generation to stamp the refill with."""

    selection: Selection | None
    model_id: str | None
    generation: bytes | None


def query_key(model: str, ref: str, filters: Mapping[str, object]) -> str:
    """The part of an entry's key after the model id: the ref and the filters, readable.

    (``model`` is implied by the model id in the key.) Refs and filter values are validated
    before this is called: letters, digits, '.', '_', '-' only.
    """
    values = ":".join("-" if filters[k] is None else str(filters[k]) for k in sorted(filters))
    return f"{ref}:{values}"


class _SharedRead:
    __slots__ = ("done", "epoch", "result")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.done = asyncio.Event()
        self.result: Lookup | None = None


class ResolveCache:
    def __init__(self, redis: Any, *, ttl_seconds: int, prefix: str = DEFAULT_PREFIX) -> None:
        self.redis = redis
        self.ttl_seconds = ttl_seconds
        self.prefix = prefix
        self._model_ids: OrderedDict[str, str] = OrderedDict()
        # Coalescing: concurrent lookups of one entry share one Redis round trip, unless this
        # process invalidated something since that round trip started (``_epoch``).
        self._inflight: dict[tuple[str, str], _SharedRead] = {}
        self._epoch = 0

    @classmethod
    def from_url(cls, url: str, *, ttl_seconds: int, prefix: str = DEFAULT_PREFIX) -> ResolveCache:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(
            url, socket_timeout=1.0, socket_connect_timeout=1.0, health_check_interval=30
        )
        return cls(client, ttl_seconds=ttl_seconds, prefix=prefix)

    def _gen_key(self, model_id: str) -> str:
        return f"{self.prefix}gen:{model_id}"

    def _entry_key(self, model_id: str, qkey: str) -> str:
        return f"{self.prefix}e:{model_id}:{qkey}"

    async def lookup(self, model: str, qkey: str) -> Lookup:
        """The cached choice, or the generation to stamp a refill with.

        Under load a fleet asks for the same entry many times at once: requests that arrive
        while a read of their entry is in flight share its answer (one round trip for all),
        unless this process has invalidated a model since that read began. A shared answer is
        at most one round trip old — it is what the request would have seen had it arrived a
        moment earlier, during the read.
        """
        model_id = self._model_ids.get(model)
        if model_id is None:
            return Lookup(None, None, None)
        key = (model_id, qkey)
        pending = self._inflight.get(key)
        if pending is not None and pending.epoch == self._epoch:
            # Each joiner waits on its own future (Event.wait): leaving cancels only its wait.
            await pending.done.wait()
            if pending.result is not None:
                return pending.result
            # The read it joined did not finish (its request went away): read here.
        mine = _SharedRead(self._epoch)
        self._inflight[key] = mine
        try:
            mine.result = await self._read(model, model_id, qkey)
            return mine.result
        finally:
            if self._inflight.get(key) is mine:
                del self._inflight[key]
            mine.done.set()

    async def _read(self, model: str, model_id: str, qkey: str) -> Lookup:
        try:
            generation, entry = await self.redis.mget(
                [self._gen_key(model_id), self._entry_key(model_id, qkey)]
            )
        except Exception as exc:
            log.warning("resolve cache read failed: %s", type(exc).__name__)
            return Lookup(None, None, None)
        generation = generation or b"0"
        if entry:
            stamp, _, payload = bytes(entry).partition(b"\n")
            if stamp == generation:
                try:
                    return Lookup(Selection.from_json(payload), model_id, generation)
                except (ValueError, TypeError, KeyError):
                    log.warning("resolve cache entry for %s is unreadable; ignored", model)
        return Lookup(None, model_id, generation)

    async def store(self, lookup: Lookup, qkey: str, selection: Selection) -> None:
        """Fill after a miss; only when the generation was read before the database query."""
        known = self._model_ids.get(selection.model)
        self._remember(selection.model, selection.model_id)
        if lookup.generation is None or lookup.model_id != selection.model_id:
            # First sight of this name (or it now names a re-created model): no generation was
            # read before the query, so this result must not be cached. The next miss will.
            if known is not None and known != selection.model_id:
                log.info("model %s was re-created; resolve cache map updated", selection.model)
            return
        value = lookup.generation + b"\n" + selection.to_json().encode()
        try:
            await self.redis.set(
                self._entry_key(selection.model_id, qkey), value, ex=self.ttl_seconds
            )
        except Exception as exc:
            log.warning("resolve cache write failed: %s", type(exc).__name__)

    def _remember(self, model: str, model_id: str) -> None:
        self._model_ids[model] = model_id
        self._model_ids.move_to_end(model)
        while len(self._model_ids) > _NAME_MAP_LIMIT:
            self._model_ids.popitem(last=False)

    async def invalidate(self, model_id: uuid.UUID | str) -> None:
        self._epoch += 1  # lookups from now on do not join reads that began before
        key = self._gen_key(str(model_id))
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.incr(key)
                pipe.expire(key, _GENERATION_TTL_SECONDS)
                await pipe.execute()
        except Exception as exc:
            # The entry TTL bounds how long a choice can stay stale when Redis is unreachable.
            log.warning(
                "resolve cache invalidation for model %s failed: %s", model_id, type(exc).__name__
            )

    async def check(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()


def build_cache(
    redis_url: str | None, *, ttl_seconds: int, key_prefix: str = ""
) -> ResolveCache | None:
    """The cache for a process: Redis when configured (scaled mode), none when embedded.
    ``key_prefix`` (broker.key_prefix) goes in front of every key, so registries sharing a
    Redis database never read or drop each other's choices."""
    if not redis_url:
        return None
    return ResolveCache.from_url(
        redis_url, ttl_seconds=ttl_seconds, prefix=f"{key_prefix}{DEFAULT_PREFIX}"
    )


def bind_cache(sessionmaker: async_sessionmaker[AsyncSession], cache: ResolveCache | None) -> None:
    """Sessions of ``sessionmaker`` bump ``cache`` for every model their commit changed
    (``tensor_registry_server.core.invalidation`` watches the flushes; writers call nothing)."""
    sessionmaker.configure(info={SESSION_INFO_KEY: cache})
    bind_invalidator(sessionmaker, None if cache is None else cache.invalidate)


def _cache_of(target: object) -> ResolveCache | None:
    if target is None or isinstance(target, ResolveCache):
        return target
    if isinstance(target, AsyncSession):
        found = target.info.get(SESSION_INFO_KEY)
        return found if isinstance(found, ResolveCache) else None
    found = getattr(target, "resolve_cache", None)
    return found if isinstance(found, ResolveCache) else None


async def invalidate_model(app_state_or_cache: object, model_id: uuid.UUID | str) -> None:
    """Bump ``model_id``'s generation: every cached choice for the model is dropped at once.

    Accepts the app state (``app.state``), a ``ResolveCache``, a session bound with
    ``bind_cache``, or None (embedded mode: nothing is cached, nothing to do). Never raises.
    """
    cache = _cache_of(app_state_or_cache)
    if cache is not None:
        await cache.invalidate(model_id)
