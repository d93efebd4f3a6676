"""Initial schema: projects, items, labellers, memberships, labels.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
ACTIVE = sa.text("retracted_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("overlap", sa.Integer, nullable=False),
        sa.Column("instructions", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "labellers",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("is_admin", sa.Boolean, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "items",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("responses", sa.JSON, nullable=False),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_items_project_id", "items", ["project_id"])
    op.create_table(
        "memberships",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False),
        sa.Column("labeller_id", sa.Integer, sa.ForeignKey("labellers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("project_id", "labeller_id", name="uq_membership"),
    )
    op.create_index("ix_memberships_labeller_id", "memberships", ["labeller_id"])
    op.create_table(
        "labels",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False),
        sa.Column("item_id", sa.Integer, sa.ForeignKey("items.id", ondelete="CASCADE"), nullable=False),
        sa.Column("labeller_id", sa.Integer, sa.ForeignKey("labellers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("submission_id", sa.String(64), nullable=False),
        sa.Column("choice", sa.String(8), nullable=False),
        sa.Column("ranking", sa.JSON, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("retracted_at", TS, nullable=True),
        sa.UniqueConstraint("labeller_id", "submission_id", name="uq_label_submission"),
    )
    op.create_index("uq_label_active", "labels", ["item_id", "labeller_id"], unique=True,
                    sqlite_where=ACTIVE, postgresql_where=ACTIVE)
    op.create_index("ix_labels_project", "labels", ["project_id", "labeller_id"])


def downgrade() -> None:
    for table in ("labels", "memberships", "items", "labellers", "projects"):
        op.drop_table(table)
