"""Imports every ORM module so that Base.metadata is complete (Alembic, tests)."""

from app.aliases import tables as aliases_tables
from app.artifacts import tables as artifacts_tables
from app.audit import tables as audit_tables
from app.core import events_outbox as events_tables
from app.db import Base
from app.jobs import tables as jobs_tables
from app.models import tables as models_tables
from app.nodes import tables as nodes_tables
from app.tokens import tables as tokens_tables
from app.versions import tables as versions_tables
from app.webhooks import tables as webhooks_tables
from app.worker_pool import tables as worker_pool_tables

metadata = Base.metadata

__all__ = [
    "aliases_tables",
    "artifacts_tables",
    "audit_tables",
    "events_tables",
    "jobs_tables",
    "metadata",
    "models_tables",
    "nodes_tables",
    "tokens_tables",
    "versions_tables",
    "webhooks_tables",
    "worker_pool_tables",
]
