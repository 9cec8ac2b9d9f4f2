"""Migrations and models agree (`alembic check`) on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from tensor_registry_server.core.db import create_engine
from tensor_registry_server.migrate import alembic_config, check, upgrade
from tests.conftest import migrated_database


def test_alembic_check_is_clean(database_url: str) -> None:
    # database_url is already upgraded to head by the fixture; check compares models to it.
    check(database_url)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_token_parents_survive_the_parent_id_migration(
    backend: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """0002 renames created_by to parent_id: children minted before it stay tied to their parent
    (so revoking the parent still stops them), and the downgrade gives the column back."""
    from alembic import command

    parent, child = uuid.uuid4(), uuid.uuid4()

    def stored(value: uuid.UUID | None) -> object:
        # SQLAlchemy's Uuid is CHAR(32) hex on SQLite, native on PostgreSQL.
        return value.hex if backend == "sqlite" and value else value

    async def execute(url: str, sql: str, rows: list[dict[str, object]]) -> list[tuple[Any, ...]]:
        engine = create_engine(url)
        try:
            async with engine.begin() as conn:
                if rows:
                    await conn.execute(text(sql), rows)
                    return []
                return [tuple(r) for r in await conn.execute(text(sql))]
        finally:
            await engine.dispose()

    with migrated_database(backend, tmp_path_factory, label="tokmig") as url:
        command.downgrade(alembic_config(url), "0001")
        insert = (
            "INSERT INTO api_tokens (id, name, token_hash, prefix, scopes, created_by, created_at) "
            "VALUES (:id, :name, :hash, 'x', '[]', :by, CURRENT_TIMESTAMP)"
        )
        asyncio.run(
            execute(url, insert, [
                {"id": stored(parent), "name": "p", "hash": "p" * 64, "by": None},
                {"id": stored(child), "name": "c", "hash": "c" * 64, "by": stored(parent)},
            ])
        )  # fmt: skip
        upgrade(url)
        rows = asyncio.run(execute(url, "SELECT name, parent_id FROM api_tokens ORDER BY name", []))
        assert [(name, uuid.UUID(str(p)) if p else None) for name, p in rows] == [
            ("c", parent),
            ("p", None),
        ]
        check(url)
        command.downgrade(alembic_config(url), "0001")
        upgrade(url)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_node_rows_without_an_owner_are_dropped_by_0008(
    backend: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """0008 gives nodes an owner: rows from before have none, and letting the first check-in
    claim them would let any token take a node over, so they go (agents re-register within a
    minute); the downgrade gives the table its old shape back."""
    from alembic import command

    async def execute(url: str, sql: str) -> list[tuple[Any, ...]]:
        engine = create_engine(url)
        try:
            async with engine.begin() as conn:
                result = await conn.execute(text(sql))
                return [tuple(r) for r in result] if result.returns_rows else []
        finally:
            await engine.dispose()

    with migrated_database(backend, tmp_path_factory, label="nodemig") as url:
        command.downgrade(alembic_config(url), "0007_people")
        asyncio.run(
            execute(
                url,
                "INSERT INTO nodes (id, hostname, agent_version, token_name, gpus, watches, "
                "cached, loaded, first_seen_at, last_seen_at) VALUES ('gpu-node-01', 'h', '', "
                "'t', '[]', '[]', '[]', '[]', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
            )
        )
        upgrade(url)
        assert asyncio.run(execute(url, "SELECT id, owner_id, owner_scope FROM nodes")) == []
        command.downgrade(alembic_config(url), "0007_people")
        assert asyncio.run(execute(url, "SELECT id FROM nodes")) == []
        upgrade(url)
        check(url)
