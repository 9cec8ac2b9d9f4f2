"""Nodes have an owner (the root of the token chain that first checked them in, with that
token's namespaces) and a stop time (an agent's final check-in).

Existing node rows are deleted: they have no owner to give them, and leaving the first check-in
to claim them would let any token take over a node during the upgrade. Agents check in every
minute and on every change, so each live node is back, owned by its own token, within a minute.

Revision ID: 0008_node_owner
Revises: 0007_people
Create Date: 2026-12-06 23:40:00

"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision: str = "0008_node_owner"
down_revision: Union[str, Sequence[str], None] = "0007_people"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.execute(sa.text("DELETE FROM nodes"))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner_id", sa.Uuid(), nullable=False))
        batch_op.add_column(sa.Column("owner_scope", sa.Text(), nullable=False))
        batch_op.add_column(sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_nodes_owner", ["owner_id", "owner_scope"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index("ix_nodes_owner")
        batch_op.drop_column("stopped_at")
        batch_op.drop_column("owner_scope")
        batch_op.drop_column("owner_id")
