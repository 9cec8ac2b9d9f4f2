"""Storage backends by name, built once per process from settings, and what this process last
learned of their health.

Health: ``check`` (what /readyz runs) records whether a backend answered. ``require_up`` is
resolve's guard (issue 29 §5: with a missing bucket /readyz failed while resolve kept handing
out URLs into it): it raises 503 ``storage_unavailable`` while the last check failed, and when
the last check is older than ``storage.recheck_seconds`` it starts one in the background, so the hot
path never waits on storage and a store that went away (or came back) is noticed within that
interval even when nothing polls /readyz.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

from tensor_registry_server.core.errors import Invalid, ServiceUnavailable
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.base import Storage
from tensor_registry_server.storage.local import LocalStorage

BACKENDS = ("local", "s3", "redis")

log = logging.getLogger("tensor_registry.storage")


@dataclass(frozen=True)
class Health:
    ok: bool
    reason: str
    checked_at: float  # time.monotonic()


class StorageRegistry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.default = settings.storage.default_backend
        self.recheck_seconds = settings.storage.recheck_seconds
        self._backends: dict[str, Storage] = {}
        self._health: dict[str, Health] = {}
        self._checks: dict[str, asyncio.Task[None]] = {}

    def configured(self) -> list[str]:
        """What jobs, uploads and the UI may name (settings: storage.backends)."""
        return self.settings.storage.configured

    def get(self, name: str | None = None) -> Storage:
        name = name or self.default
        if name not in self._backends:
            if name in BACKENDS and name not in self.configured():
                # Never a default address: an unconfigured backend is refused, not guessed.
                raise Invalid(
                    f"Storage backend '{name}' is not configured on this registry; "
                    f"configured: {', '.join(self.configured())}.",
                    code="storage_not_configured",
                    configured=self.configured(),
                )
            self._backends[name] = self._build(name)
        return self._backends[name]

    def built(self) -> list[Storage]:
        """The backends this process has used so far (the sweep walks these)."""
        return list(self._backends.values())

    def _build(self, name: str) -> Storage:
        if name == "local":
            return LocalStorage(self.settings.local_storage_root)
        if name == "s3":
            # Imported here: the API and the client stay importable without the AWS SDKs.
            from tensor_registry_server.storage.s3 import S3Storage

            return S3Storage(self.settings.storage.s3)
        if name == "redis":
            from tensor_registry_server.storage.redis_store import RedisStorage

            return RedisStorage(self.settings.storage.redis)
        raise Invalid(
            f"Storage backend '{name}' is not configured; use one of {', '.join(BACKENDS)}.",
            code="unknown_storage",
        )

    async def check(self, name: str | None = None) -> None:
        """Run the backend's check (StorageError or a timeout when it is unusable), and
        remember the outcome for ``require_up``."""
        name = name or self.default
        try:
            await asyncio.wait_for(
                self.get(name).check(), self.settings.storage.check_timeout_seconds
            )
        except Exception as exc:
            self._health[name] = Health(False, type(exc).__name__, time.monotonic())
            raise
        self._health[name] = Health(True, "ok", time.monotonic())

    def health(self, name: str) -> Health | None:
        return self._health.get(name)

    def require_up(self, name: str) -> None:
        """503 ``storage_unavailable`` when ``name``'s last check failed; never waits."""
        known = self._health.get(name)
        stale = known is None or time.monotonic() - known.checked_at > self.recheck_seconds
        running = self._checks.get(name)
        if stale and (running is None or running.done()):
            self._checks[name] = asyncio.get_running_loop().create_task(self._background(name))
        if known is not None and not known.ok:
            raise ServiceUnavailable(
                f"Storage '{name}' is unavailable ({known.reason}); no URLs into it are handed "
                "out until it answers again.",
                code="storage_unavailable",
                headers={"Retry-After": str(max(1, math.ceil(self.recheck_seconds)))},
                storage=name,
            )

    async def _background(self, name: str) -> None:
        try:
            await self.check(name)
        except Exception as exc:
            log.warning("storage %s unavailable: %s", name, type(exc).__name__)

    async def close(self) -> None:
        for task in self._checks.values():
            task.cancel()
        for backend in self._backends.values():
            await backend.close()
