# Licensed under the Apache License, Version 2.0 (the "License"); you may
# not use this file except in compliance with the License. You may obtain
# a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
# License for the specific language governing permissions and limitations
# under the License.

"""The scheduler's node checks in SQL, over the synced columns.

What ``instances.match_nodes`` asks of a node, the database asks here of
the ``compute_nodes`` columns, so that a request reads a few rows per host
instead of decoding every row:

* :func:`free_counts` counts the free matching nodes of each host up to a
  limit per host, with an index range per host that stops at the limit:
  its cost grows with the number of hosts, not of nodes;
* :func:`free_nodes` lists the free matching nodes of one host, up to a
  limit (what ``instance create`` claims among, with Placement);
* :func:`fail_counts` counts every node of the hosts by the first check
  it fails (``instances.reasons``), to word a refusal; it reads every row
  of those hosts, and only runs when nothing fits.
"""

import collections
import functools

import sqlalchemy as sa
from sqlalchemy.ext import compiler

from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.instances import model as inst

_nodes = models.compute_nodes
_instances = models.instances
_services = models.services
_FORCE_INDEX = 'FORCE INDEX (compute_nodes_host_rc_available_idx)'

_FITS = 'fits'
# A probe is ordered as the index over (host, resource class, available,
# deleted): the planner then walks it and stops at the limit, where a
# bitmap scan of the host's rows would read them all first.
_INDEX_ORDER = (_nodes.c.host, _nodes.c.resource_class, _nodes.c.available,
                _nodes.c.deleted)


def _taken():
    """A live instance is on the node (its row may still say available)."""
    return (sa.select(sa.literal(1))
            .where(_instances.c.node == _nodes.c.uuid,
                   _instances.c.deleted == 0).exists())


def _not_taken_counted():
    """No live instance is on the node, as a count through the unique index
    on (node, deleted): MariaDB turns NOT EXISTS into a semi-join that
    first materialises the node of every live instance of the cloud."""
    return (sa.select(sa.func.count())
            .where(_instances.c.node == _nodes.c.uuid,
                   _instances.c.deleted == 0).scalar_subquery() == 0)


class _Position(sa.sql.expression.FunctionElement):
    """Where the second string starts in the first (1-based; 0: nowhere),
    compared exactly: a node has a trait only as written, as in Python.

    Not LIKE, which SQLite compares without case; on MariaDB the columns
    matched have a binary collation (migration 0011).
    """

    type = sa.Integer()
    inherit_cache = True


@compiler.compiles(_Position)
def _instr(element, compiler_, **kw):
    return f'instr({compiler_.process(element.clauses, **kw)})'


@compiler.compiles(_Position, 'postgresql')
def _strpos(element, compiler_, **kw):
    return f'strpos({compiler_.process(element.clauses, **kw)})'


def _has_all(column, needles):
    """The ``column`` ('|A|B|') holds every one of ``needles`` (SQL
    expressions of trait_needle or capability_needle)."""
    column = sa.func.coalesce(column, '')
    return sa.and_(sa.true(), *(_Position(column, needle) > 0
                                for needle in needles))


def trait_needle(trait):
    """What the traits column ('|A|B|') holds when the node has ``trait``."""
    return f'|{trait}|'


def capability_needle(key, value):
    """What the capabilities column ('|k:v|...|') holds when the node has
    capability ``key`` with ``value`` (a key has no ':' nor '|', a value no
    '|': the needle cannot straddle two)."""
    return f'|{key}:{value}|'


_CAPABILITIES = 'capabilities'


def _checks(resource_class, vcpus, memory_mb, disk_gb, traits,
            capabilities):
    """reason -> the SQL condition a node meets when that check passes.

    The arguments are SQL expressions (bound parameters, or literals).
    """
    return {
        inst.TAKEN: sa.not_(_taken()),
        'not available': _nodes.c.available == sa.true(),
        # Each one TRUE or FALSE, never NULL: NOT NULL is NULL, and a CASE
        # would count the node under a later reason.
        'of another resource class': sa.and_(
            _nodes.c.resource_class.is_not(None),
            _nodes.c.resource_class == resource_class),
        'with too few vcpus': _nodes.c.vcpus >= vcpus,
        'with too little memory': _nodes.c.memory_mb >= memory_mb,
        'with too little disk': _nodes.c.local_gb >= disk_gb,
        'without the traits': _has_all(_nodes.c.traits, traits),
        # All of them at once; fail_counts asks one at a time.
        _CAPABILITIES: _has_all(_nodes.c.capabilities, capabilities),
    }


def _passes(spec):
    return _checks(spec.resource_class, spec.vcpus, spec.memory_mb,
                   spec.disk_needed_gb(),
                   [trait_needle(t) for t in sorted(spec.traits)],
                   [capability_needle(*c) for c in spec.capabilities])


def _of_hosts(hosts, partition_key):
    condition = sa.and_(_nodes.c.host.in_(sorted(hosts)),
                        _nodes.c.deleted == 0)
    if partition_key is not None:
        condition = sa.and_(condition,
                            _nodes.c.conductor_group == partition_key)
    return condition


def _fits(n_traits, n_caps, partitioned, host, counted=False):
    """The free-node condition for one host, as bound parameters.

    ``counted``: the taken check as a count (see _not_taken_counted).
    """
    checks = _checks(sa.bindparam('rc', type_=sa.String),
                     sa.bindparam('vcpus', type_=sa.Integer),
                     sa.bindparam('memory_mb', type_=sa.Integer),
                     sa.bindparam('disk_gb', type_=sa.Integer),
                     [sa.bindparam(f'trait_{i}', type_=sa.String)
                      for i in range(n_traits)],
                     [sa.bindparam(f'cap_{i}', type_=sa.String)
                      for i in range(n_caps)])
    if counted:
        checks[inst.TAKEN] = _not_taken_counted()
    # The taken check last: a subquery, after the columns' checks.
    condition = sa.and_(_nodes.c.host == host, _nodes.c.deleted == 0,
                        *(checks[reason] for reason in inst.REASONS
                          if reason != inst.TAKEN), checks[_CAPABILITIES],
                        checks[inst.TAKEN])
    if partitioned:
        condition = sa.and_(condition, _nodes.c.conductor_group
                            == sa.bindparam('group', type_=sa.String))
    return condition


@functools.lru_cache(maxsize=64)
def _free_statement(dialect, n_hosts, n_traits, n_caps, partitioned):
    """The statement of free_counts for this shape of request.

    Built once per shape: the values are bound parameters (the spec's, and
    on PostgreSQL host_<i>, limit_<i> for each host; elsewhere hosts_<i>,
    limit_<i>, offset_<i> for each distinct limit), so a request neither
    builds nor compiles it. ``n_hosts`` counts the distinct limits there.
    """
    if dialect == 'postgresql':
        # One correlated probe per row of a VALUES list: PostgreSQL plans it
        # once, where it would plan each arm of a UNION.
        hosts = sa.values(sa.column('host', sa.String),
                          sa.column('lim', sa.Integer), name='probed').data(
            [(sa.bindparam(f'host_{i}', type_=sa.String),
              sa.bindparam(f'limit_{i}', type_=sa.Integer))
             for i in range(n_hosts)])
        probe = (sa.select(sa.literal(1))
                 .where(_fits(n_traits, n_caps, partitioned, hosts.c.host))
                 .order_by(*_INDEX_ORDER)
                 .limit(hosts.c.lim).correlate(hosts).subquery())
        counted = (sa.select(sa.func.count()).select_from(probe)
                   .scalar_subquery())
        # Not the rows that pad the list (see free_counts).
        return sa.select(hosts.c.host, counted).where(
            hosts.c.host.is_not(None))
    # MariaDB (and SQLite): no correlated derived table (LATERAL), but a
    # correlated scalar subquery is planned once for every row of the outer
    # query. Per host: is there an L-th free matching row (OFFSET L-1, an
    # index range that stops there)? Then L; else count them all (fewer
    # than L). The hosts of one limit are one arm, over their services rows
    # (an expanding IN list): the text depends on the number of distinct
    # limits, not of hosts.
    mysql = dialect in ('mysql', 'mariadb')
    arms = []
    for i in range(n_hosts):
        host = _services.c.host
        probe = (sa.select(_nodes.c.id).select_from(_nodes)
                 .where(_fits(n_traits, n_caps, partitioned, host, mysql))
                 .order_by(*_INDEX_ORDER).limit(1)
                 .offset(sa.bindparam(f'offset_{i}', type_=sa.Integer)))
        count = (sa.select(sa.func.count()).select_from(_nodes)
                 .where(_fits(n_traits, n_caps, partitioned, host, mysql)))
        if mysql:
            # The host is only known at run time: without the hint the
            # planner may walk (host, deleted), every row of the host.
            probe = probe.with_hint(_nodes, _FORCE_INDEX, dialect)
            count = count.with_hint(_nodes, _FORCE_INDEX, dialect)
        free = sa.case((probe.scalar_subquery().is_not(None),
                        sa.bindparam(f'limit_{i}', type_=sa.Integer)),
                       else_=count.scalar_subquery())
        arms.append(sa.select(host, free).where(
            host.in_(sa.bindparam(f'hosts_{i}', expanding=True)),
            _services.c.binary == db_services.BINARY, _services.c.deleted == 0))
    return sa.union_all(*arms) if len(arms) > 1 else arms[0]


def free_counts(ctx, spec, limits, partition_key=None):
    """{host: free nodes matching ``spec``, counted up to limits[host]}.

    One statement, whose cost grows with the number of hosts, not of
    nodes: per host, an index range over host, resource class and
    available that stops at the limit.
    """
    limits = {host: limit for host, limit in limits.items() if limit > 0}
    if not limits:
        return {}
    traits = sorted(spec.traits)
    params = {'rc': spec.resource_class, 'vcpus': spec.vcpus,
              'memory_mb': spec.memory_mb, 'disk_gb': spec.disk_needed_gb(),
              'group': partition_key}
    for i, trait in enumerate(traits):
        params[f'trait_{i}'] = trait_needle(trait)
    for i, capability in enumerate(spec.capabilities):
        params[f'cap_{i}'] = capability_needle(*capability)
    n_caps = len(spec.capabilities)
    dialect = ctx.session.dialect
    if dialect.name == 'postgresql':
        probed = sorted(limits.items())
        # SQLAlchemy does not cache the compiled form of a VALUES list: a
        # few lengths (powers of two), padded with rows that probe nothing
        # (no host, LIMIT 0), so that any number of hosts finds one.
        rows = _padded(len(probed))
        probed += [(None, 0)] * (rows - len(probed))
        for i, (host, limit) in enumerate(probed):
            params[f'host_{i}'] = host
            params[f'limit_{i}'] = limit
        compiled = _compiled(dialect, rows, len(traits), n_caps,
                             partition_key is not None)
        result = ctx.session.exec_driver_sql(
            compiled.string, compiled.construct_params(params))
    else:
        by_limit = collections.defaultdict(list)
        for host, limit in sorted(limits.items()):
            by_limit[limit].append(host)
        for i, (limit, hosts) in enumerate(sorted(by_limit.items())):
            params[f'hosts_{i}'] = hosts
            params[f'limit_{i}'] = limit
            params[f'offset_{i}'] = limit - 1
        result = ctx.session.execute(_free_statement(
            dialect.name, len(by_limit), len(traits), n_caps,
            partition_key is not None), params)
    return {host: count for host, count in result if count}


def _padded(count):
    """The length of the VALUES list that probes ``count`` hosts."""
    return max(8, 1 << (count - 1).bit_length())


@functools.lru_cache(maxsize=64)
def _compiled(dialect, n_hosts, n_traits, n_caps, partitioned):
    return _free_statement(dialect.name, n_hosts, n_traits, n_caps,
                           partitioned).compile(dialect=dialect)


def free_nodes(ctx, spec, host, limit, partition_key=None):
    """The uuids of up to ``limit`` free nodes of ``host`` that match
    ``spec`` (of ``partition_key``, if given), in the index's order: an
    index range over the host's rows that stops at the limit."""
    dialect = ctx.session.dialect.name
    mysql = dialect in ('mysql', 'mariadb')
    passes = _passes(spec)
    if mysql:
        passes[inst.TAKEN] = _not_taken_counted()
    # The taken check last: a subquery, after the columns' checks.
    query = (sa.select(_nodes.c.uuid)
             .where(_of_hosts([host], partition_key),
                    *(passes[reason] for reason in inst.REASONS
                      if reason != inst.TAKEN), passes[inst.TAKEN])
             .order_by(*_INDEX_ORDER, _nodes.c.uuid).limit(limit))
    if mysql:
        query = query.with_hint(_nodes, _FORCE_INDEX, dialect)
    return list(ctx.session.execute(query).scalars())


def fail_counts(ctx, spec, hosts, partition_key=None):
    """(Counter of reason -> nodes failing it first, nodes in all).

    Over every live row of ``hosts`` (of ``partition_key``, if given); the
    nodes that fit are counted under no reason.
    """
    passes = _passes(spec)
    failing = [(sa.not_(passes[why]), why) for why in inst.REASONS]
    # One reason per capability asked for, so the refusal names each one
    # the nodes lacked.
    failing += [(sa.not_(_has_all(_nodes.c.capabilities,
                                  [capability_needle(key, value)])),
                 inst.lacks(key, value))
                for key, value in spec.capabilities]
    reason = sa.case(*failing, else_=_FITS)
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
