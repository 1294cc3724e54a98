"""Schema operations the migrations share.

SQLite cannot ALTER a table in place: alembic's batch mode copies it, and
does so once for all the columns given together.
"""

from alembic import op


def add_columns(table, *columns):
    """Add ``columns`` (sa.Column) to ``table`` in one batch."""
    with op.batch_alter_table(table) as batch:
        for column in columns:
            batch.add_column(column)
