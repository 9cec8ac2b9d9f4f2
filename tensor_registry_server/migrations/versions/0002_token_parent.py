"""Tokens record the token that minted them: created_by becomes parent_id, indexed, a foreign key.

Revocation cascades to descendants and authentication walks the ancestors, so both need the
parent link indexed. The column keeps its values: every existing child stays tied to its parent.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 19:00:00.000000

"""
from typing import Sequence, Union

from alembic import op


# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.alter_column("created_by", new_column_name="parent_id")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_tokens_parent_id"), ["parent_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_api_tokens_parent_id_api_tokens"), "api_tokens", ["parent_id"], ["id"]
        )


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_api_tokens_parent_id_api_tokens"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_api_tokens_parent_id"))
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.alter_column("parent_id", new_column_name="created_by")
