"""items.labels_count: the active non-skip labels on an item, kept by submit and undo.

The queue's "fewest labels first" then reads one indexed column instead of aggregating every
label on every request (which made each next-item call cost O(all labels) and, on fresh tables
without planner statistics, O(items x labels)).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items") as batch:
        batch.add_column(sa.Column("labels_count", sa.Integer, nullable=False, server_default="0"))
    op.execute("UPDATE items SET labels_count = (SELECT count(*) FROM labels WHERE labels.item_id = items.id "
               "AND labels.retracted_at IS NULL AND labels.choice != 'skip')")
    op.create_index("ix_items_queue", "items", ["project_id", "labels_count"])


def downgrade() -> None:
    op.drop_index("ix_items_queue", "items")
    with op.batch_alter_table("items") as batch:
        batch.drop_column("labels_count")
