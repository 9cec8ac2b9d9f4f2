"""Imports every ORM module so that Base.metadata is complete (Alembic, tests)."""

from app.aliases import models as aliases_models
from app.artifacts import models as artifacts_models
from app.audit import models as audit_models
from app.db import Base
from app.fleet import models as fleet_models
from app.jobs import models as jobs_models
from app.models import models as models_models
from app.tokens import models as tokens_models
from app.versions import models as versions_models

metadata = Base.metadata

__all__ = [
    "aliases_models",
    "artifacts_models",
    "audit_models",
    "fleet_models",
    "jobs_models",
    "metadata",
    "models_models",
    "tokens_models",
    "versions_models",
]
