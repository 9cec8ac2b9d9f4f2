"""Shared fixtures: real databases (SQLite and PostgreSQL), the ASGI app, tokens.

Every database test runs on both backends. PostgreSQL is the server on 127.0.0.1:5432 (override
with TEST_POSTGRES_URL); each test session creates its own database and drops it at the end, so
parallel runs never collide. With CI=true a missing PostgreSQL fails the run instead of skipping.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
from tensor_registry_server.main import create_app
from tensor_registry_server.migrate import upgrade
from tensor_registry_server.settings import Settings
from tensor_registry_server.tables import metadata

ADMIN_TOKEN = "trg_test-admin-token-0123456789abcdefghijklmnopqrstu"
POSTGRES_ADMIN_URL = os.environ.get(
    "TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
IN_CI = os.environ.get("CI", "").lower() == "true"


def _postgres_available() -> bool:
    async def probe() -> None:
        engine = create_async_engine(POSTGRES_ADMIN_URL)
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        finally:
            await engine.dispose()

    try:
        asyncio.run(asyncio.wait_for(probe(), 5))
        return True
    except Exception:
        return False


async def _admin_execute(sql: str) -> None:
    engine = create_async_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


@contextmanager
def migrated_database(
    backend: str, tmp_path_factory: pytest.TempPathFactory, *, label: str = "test"
) -> Iterator[str]:
    """A fresh database at the latest migration: a SQLite file, or a PostgreSQL database made
    for this session and dropped after it. PostgreSQL missing: fail in CI, skip elsewhere."""
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp(f'{label}-sqlite') / 'registry.db'}"
        upgrade(url)
        yield url
        return
    if not _postgres_available():
        if IN_CI:
            pytest.fail(
                f"PostgreSQL is required in CI and is not reachable at {POSTGRES_ADMIN_URL}"
            )
        pytest.skip("PostgreSQL not reachable")
    name = f"tr_{label}_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin_execute(f'CREATE DATABASE "{name}"'))
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        asyncio.run(_admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with migrated_database(request.param, tmp_path_factory) as url:
        yield url


@pytest.fixture
def postgresql_only(database_url: str) -> None:
    """Marks a test of PostgreSQL's own behaviour (row locks; SQLite serialises writers with
    its write lock instead): its SQLite copy is deselected at collection
    (pytest_collection_modifyitems below), so a CI run reports no skipped backend."""
    assert database_url.startswith("postgresql")


def deselect_copies(
    config: pytest.Config, items: list[pytest.Item], marker: str, param: str, value: str
) -> None:
    """Deselect (never skip: a CI run reports no skipped backend) the copies of the tests that
    use fixture ``marker`` whose parameter ``param`` is ``value``."""
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        copy = callspec is not None and callspec.params.get(param) == value
        (drop if copy and marker in getattr(item, "fixturenames", ()) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_copies(config, items, "postgresql_only", "database_url", "sqlite")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        database={"url": database_url},  # type: ignore[arg-type]
        public_url="http://testserver",
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        storage={  # type: ignore[arg-type]
            "import_roots": [str(data_dir.parent / "imports")],
            # A loaded CI machine: a local check that waits for a core is not a storage down
            # (the stores the tests take down answer at once: a deleted bucket, a closed port).
            "check_timeout_seconds": 30,
        },
    )


async def _reset(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        async with engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                await conn.execute(table.delete())
    finally:
        await engine.dispose()


# For tests that build an app with their own settings (the app fixture's clean start).
reset_database = _reset


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[object]:
    """The real app over a clean database, with the bootstrap admin token in place."""
    from tensor_registry_server.tokens.service import ensure_bootstrap_admin

    await _reset(settings.database_url)
    engine = create_engine(settings.database_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        await ensure_bootstrap_admin(session, ADMIN_TOKEN)
    await engine.dispose()
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@asynccontextmanager
async def app_and_client(settings: Settings) -> AsyncIterator[tuple[object, httpx.AsyncClient]]:
    """What the app and client fixtures give, for a test that builds the app with settings of
    its own: the real app over a clean database, the bootstrap admin token in place, and a
    client holding it."""
    from tensor_registry_server.tokens.service import ensure_bootstrap_admin

    await _reset(settings.database_url)
    engine = create_engine(settings.database_url)
    async with session_scope(make_sessionmaker(engine)) as session:
        await ensure_bootstrap_admin(session, ADMIN_TOKEN)
    await engine.dispose()
    application = create_app(settings)
    async with (
        application.router.lifespan_context(application),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application),
            base_url="http://testserver",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as c,
    ):
        yield application, c


@pytest.fixture
async def client(app: object) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://testserver",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as c:
        yield c


@pytest.fixture
async def anon(app: object) -> AsyncIterator[httpx.AsyncClient]:
    """The same app with no Authorization header: what anyone on the network gets."""
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c
