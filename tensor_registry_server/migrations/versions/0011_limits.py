"""Per-namespace limit overrides (issue 36 §2).

Revision ID: 0011_limits
Revises: 0010_warm_bundles
Create Date: 2026-12-07 00:20:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_limits"
down_revision: str | Sequence[str] | None = "0010_warm_bundles"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "namespace_limits",
        sa.Column("namespace", sa.String(length=128), nullable=False),
        sa.Column("storage_bytes", sa.BigInteger(), nullable=True),
        sa.Column("upload_bytes", sa.BigInteger(), nullable=True),
        sa.Column("concurrent_jobs", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace", name=op.f("pk_namespace_limits")),
    )


def downgrade() -> None:
    op.drop_table("namespace_limits")
