"""Removing bytes once the rows that pointed at them are gone.

Deletes run after the database commit: if the commit fails nothing is lost, and if the delete
fails (or the process dies first) the bytes are orphans that the periodic sweep removes.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.core.db import after_commit
from tensor_registry_server.storage.base import StorageError
from tensor_registry_server.storage.registry import StorageRegistry

log = logging.getLogger("tensor_registry.storage")


def delete_after_commit(
    session: AsyncSession, storages: StorageRegistry, storage_name: str, key_or_prefix: str
) -> None:
    async def delete() -> None:
        try:
            backend = storages.get(storage_name)
            if key_or_prefix.endswith("/"):
                await backend.delete_prefix(key_or_prefix)
            else:
                await backend.delete(key_or_prefix)
        except StorageError:
            log.warning("could not delete %s:%s; left for the sweep", storage_name, key_or_prefix)

    after_commit(session, delete)
