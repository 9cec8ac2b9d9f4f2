"""Alembic migrations: one stream for SQLite and PostgreSQL."""
