"""Migrations and models agree (`alembic check`) on SQLite and PostgreSQL."""

from __future__ import annotations

from app.migrate import check


def test_alembic_check_is_clean(database_url: str) -> None:
    # database_url is already upgraded to head by the fixture; check compares models to it.
    check(database_url)
