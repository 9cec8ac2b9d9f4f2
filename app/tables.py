"""Imports every ORM module so that Base.metadata is complete (Alembic, tests)."""

from app.core import events_outbox as events_tables
from app.db import Base
from app.rows import aliases as aliases_tables
from app.rows import artifacts as artifacts_tables
from app.rows import audit as audit_tables
from app.rows import jobs as jobs_tables
from app.rows import models as models_tables
from app.rows import nodes as nodes_tables
from app.rows import tokens as tokens_tables
from app.rows import versions as versions_tables
from app.rows import warm_bundles as warm_bundles_tables
from app.rows import webhooks as webhooks_tables
from app.rows import worker_pool as worker_pool_tables

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
    "warm_bundles_tables",
    "webhooks_tables",
    "worker_pool_tables",
]
