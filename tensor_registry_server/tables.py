"""Imports every ORM module so that Base.metadata is complete (Alembic, tests)."""

from tensor_registry_server.core import events_outbox as events_tables
from tensor_registry_server.core.db import Base
from tensor_registry_server.rows import aliases as aliases_tables
from tensor_registry_server.rows import artifacts as artifacts_tables
from tensor_registry_server.rows import audit as audit_tables
from tensor_registry_server.rows import jobs as jobs_tables
from tensor_registry_server.rows import limits as limits_tables
from tensor_registry_server.rows import models as models_tables
from tensor_registry_server.rows import nodes as nodes_tables
from tensor_registry_server.rows import people as people_tables
from tensor_registry_server.rows import retention as retention_tables
from tensor_registry_server.rows import tokens as tokens_tables
from tensor_registry_server.rows import versions as versions_tables
from tensor_registry_server.rows import warm_bundles as warm_bundles_tables
from tensor_registry_server.rows import webhooks as webhooks_tables
from tensor_registry_server.rows import worker_pool as worker_pool_tables

metadata = Base.metadata

__all__ = [
    "aliases_tables",
    "artifacts_tables",
    "audit_tables",
    "events_tables",
    "jobs_tables",
    "limits_tables",
    "metadata",
    "models_tables",
    "nodes_tables",
    "people_tables",
    "retention_tables",
    "tokens_tables",
    "versions_tables",
    "warm_bundles_tables",
    "webhooks_tables",
    "worker_pool_tables",
]
