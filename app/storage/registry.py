"""Storage backends by name, built once per process from settings."""

from __future__ import annotations

from app.errors import Invalid
from app.settings import Settings
from app.storage.base import Storage
from app.storage.local import LocalStorage

BACKENDS = ("local", "s3", "redis")


class StorageRegistry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.default = settings.storage.default_backend
        self._backends: dict[str, Storage] = {}

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
            from app.storage.s3 import S3Storage

            return S3Storage(self.settings.storage.s3)
        if name == "redis":
            from app.storage.redis_store import RedisStorage

            return RedisStorage(self.settings.storage.redis)
        raise Invalid(
            f"Storage backend '{name}' is not configured; use one of {', '.join(BACKENDS)}.",
            code="unknown_storage",
        )

    async def close(self) -> None:
        for backend in self._backends.values():
            await backend.close()
