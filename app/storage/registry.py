"""Storage backends by name, built once per process from settings."""

from __future__ import annotations

from app.errors import Invalid
from app.settings import Settings
from app.storage.base import Storage
from app.storage.local import LocalStorage


class StorageRegistry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.default = settings.storage.default_backend
        self._backends: dict[str, Storage] = {}

    def get(self, name: str | None = None) -> Storage:
        name = name or self.default
        if name not in self._backends:
            self._backends[name] = self._build(name)
        return self._backends[name]

    def _build(self, name: str) -> Storage:
        if name == "local":
            return LocalStorage(self.settings.local_storage_root)
        raise Invalid(f"Storage backend '{name}' is not configured.", code="unknown_storage")

    async def close(self) -> None:
        for backend in self._backends.values():
            await backend.close()
