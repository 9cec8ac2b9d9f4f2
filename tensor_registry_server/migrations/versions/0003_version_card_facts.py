"""Versions keep what finalize read: architecture, parameter count, dtype breakdown.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 18:45:00

Nullable: versions finalized before this revision (and drafts) have none; the model page shows
"–" for them. Backfilling would mean re-reading every version's safetensors headers from storage,
which a migration must not do.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = "0003"
down_revision: Union[str, Sequence[str], None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("architecture", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("parameter_count", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("dtype_breakdown", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.drop_column("dtype_breakdown")
        batch_op.drop_column("parameter_count")
        batch_op.drop_column("architecture")
