"""What the unit tests read back from the database."""

import sqlalchemy as sa

from ironic_compute.db import models


def live_nodes(engine, column='host'):
    """``{uuid: value of column}`` of the live compute_nodes rows (by default:
    who holds each node)."""
    table = models.ComputeNode.__table__
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(table.c.uuid, table.c[column])
                                 .where(table.c.deleted == 0)).all())
