"""Queries on ``instances``: who manages the instance on which node."""

import sqlalchemy as sa

from ironic_compute import ownership
from ironic_compute.db import api as db_api
from ironic_compute.db import models

_instances = models.Instance.__table__


@db_api.context_manager.reader
def load_all(ctx, node=None):
    """Every live instance (on ``node`` only, if given) as InstanceInfo."""
    query = (sa.select(_instances.c.uuid, _instances.c.host, _instances.c.node)
             .where(_instances.c.deleted == 0))
    if node is not None:
        query = query.where(_instances.c.node == node)
    result = ctx.session.execute(query)
    return [ownership.InstanceInfo(uuid, host or '', node)
            for uuid, host, node in result]
