"""Default variants: an alias (or a model) names the variant resolve serves when a request
does not say, so a new build never changes what a fleet loads until someone says so.

Revision ID: 0005_server
Revises: 0004
Create Date: 2026-12-06 05:00:00.000000

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision: str = "0005_server"
down_revision: Union[str, Sequence[str], None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("aliases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("default_variant", sa.JSON(), nullable=True))
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("default_variant", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_column("default_variant")
    with op.batch_alter_table("aliases", schema=None) as batch_op:
        batch_op.drop_column("default_variant")
