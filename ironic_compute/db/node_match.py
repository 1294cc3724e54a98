"""The scheduler's node checks in SQL, over the synced columns.

What ``instances.match_nodes`` asks of a node, the database asks here of
the ``compute_nodes`` columns, so that a request reads a few rows per host
instead of decoding every row:

* :func:`free_counts` counts the free matching nodes of each host up to a
  limit per host, with an index range per host that stops at the limit:
  its cost grows with the number of hosts, not of nodes;
* :func:`fail_counts` counts every node of the hosts by the first check
  it fails (``instances.REASONS``), to word a refusal; it reads every row
  of those hosts, and only runs when nothing fits.
"""

import collections

import sqlalchemy as sa

from ironic_compute import instances as inst
from ironic_compute.db import models

_nodes = models.ComputeNode.__table__
_instances = models.Instance.__table__

_FITS = 'fits'


def _taken():
    """A live instance is on the node (its row may still say available)."""
    return (sa.select(sa.literal(1))
            .where(_instances.c.node == _nodes.c.uuid,
                   _instances.c.deleted == 0).exists())


def _has_traits(spec):
    traits = sa.func.coalesce(_nodes.c.traits, '')
    return sa.and_(sa.true(), *(traits.contains(f'|{trait}|', autoescape=True)
                                for trait in sorted(spec.traits)))


def _passes(spec):
    """reason -> the SQL condition a node meets when that check passes."""
    return {
        inst.TAKEN: sa.not_(_taken()),
        'not available': _nodes.c.available == sa.true(),
        # Each one TRUE or FALSE, never NULL: NOT NULL is NULL, and a CASE
        # would count the node under a later reason.
        'of another resource class': sa.and_(
            _nodes.c.resource_class.is_not(None),
            _nodes.c.resource_class == spec.resource_class),
        'with too few vcpus': _nodes.c.vcpus >= spec.vcpus,
        'with too little memory': _nodes.c.memory_mb >= spec.memory_mb,
        'with too little disk': _nodes.c.local_gb >= spec.disk_gb,
        'without the traits': _has_traits(spec),
    }


def _of_hosts(hosts, partition_key):
    condition = sa.and_(_nodes.c.host.in_(sorted(hosts)),
                        _nodes.c.deleted == 0)
    if partition_key is not None:
        condition = sa.and_(condition,
                            _nodes.c.conductor_group == partition_key)
    return condition


def free_counts(ctx, spec, limits, partition_key=None):
    """{host: free nodes matching ``spec``, counted up to limits[host]}.

    One statement: per host, the first ``limit`` free matching rows (an
    index range over host, resource class and available), all of them
    counted by host. A host with none is missing from the result.
    """
    passes = _passes(spec)
    fits = sa.and_(*(passes[reason] for reason in inst.REASONS))
    probes = []
    for host, limit in sorted(limits.items()):
        if limit <= 0:
            continue
        probe = (sa.select(_nodes.c.host)
                 .where(_of_hosts([host], partition_key), fits)
                 .limit(limit).subquery())
        probes.append(sa.select(probe.c.host))
    if not probes:
        return {}
    counted = sa.union_all(*probes).subquery()
    return dict(ctx.session.execute(
        sa.select(counted.c.host, sa.func.count())
        .group_by(counted.c.host)).all())


def fail_counts(ctx, spec, hosts, partition_key=None):
    """(Counter of reason -> nodes failing it first, nodes in all).

    Over every live row of ``hosts`` (of ``partition_key``, if given); the
    nodes that fit are counted under no reason.
    """
    passes = _passes(spec)
    reason = sa.case(*((sa.not_(passes[why]), why) for why in inst.REASONS),
                     else_=_FITS)
    # Grouped in an outer query: PostgreSQL cannot group by an expression
    # holding bound parameters.
    labelled = (sa.select(reason.label('reason'))
                .where(_of_hosts(hosts, partition_key)).subquery())
    counts = collections.Counter(dict(ctx.session.execute(
        sa.select(labelled.c.reason, sa.func.count())
        .group_by(labelled.c.reason)).all()))
    total = sum(counts.values())
    counts.pop(_FITS, None)
    return counts, total
