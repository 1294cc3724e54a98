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

"""Scheduling: which host builds a new instance, and its build request
recorded there, under the schedulers' lock.

The candidates (the live services of the request's conductor group, on the
database's clock) are read first; the choice (instances/scheduler.py's pure
rules over the hosts' loads and free matching nodes) and the insert
(db/instances.py's ``create``) are made under one lock row, so two requests
made at once never count the same free node.

With Placement (placement/placing.py), the choice and a few of the chosen
host's free nodes are read without the lock (choose_with_free_nodes), one
node is claimed in Placement, and only then is the row recorded, on that
node, under the lock (create_on_node): Placement, not the lock, keeps two
schedulers from taking one node, and no lock is held across its requests.
"""

import functools

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.cluster import liveness
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import liveness as db_liveness
from ironic_compute.db import locks as db_locks
from ironic_compute.db import models
from ironic_compute.db import node_match
from ironic_compute.db import services as db_services
from ironic_compute.instances import model as inst
from ironic_compute.instances import scheduler

_instances = models.instances
_services = models.services


def lock_schedulers(ctx):
    """Serialise schedulers: each holds the ``scheduler`` row of ``locks``
    from its first statement to its commit, so two schedulers never count
    the same free node (see db/locks.py: an UPDATE, bounded waits).

    A context manager, entered first in the transaction. Heartbeats and
    ``db sync`` never wait for it: nothing else writes that row.
    """
    return db_locks.held(ctx, db_locks.SCHEDULER)


@functools.cache
def _loads_statement(dialect):
    """Per service of the hosts: its builds waiting for a node, and its live
    instances. Counted by correlated subqueries, index ranges only: (host,
    deleted) for the instances, (host, task_state, deleted) for each
    waiting state; a GROUP BY over the instances reads the row of every
    live instance."""
    host = _services.c.host
    live = (sa.select(sa.func.count()).select_from(_instances)
            .where(_instances.c.host == host, _instances.c.deleted == 0))
    waiting = []
    for state in (inst.SCHEDULED, inst.SPAWNING):
        count = (sa.select(sa.func.count()).select_from(_instances)
                 .where(_instances.c.host == host,
                        _instances.c.task_state == state,
                        _instances.c.deleted == 0,
                        _instances.c.node.is_(None)))
        if dialect in ('mysql', 'mariadb'):
            # Not the index on (node, deleted): every waiting build.
            count = count.with_hint(
                _instances, 'FORCE INDEX (instances_host_task_state_idx)',
                dialect)
        waiting.append(count.scalar_subquery())
    return (sa.select(host, waiting[0] + waiting[1],
                      live.scalar_subquery())
            .where(host.in_(sa.bindparam('hosts', expanding=True)),
                   _services.c.binary == db_services.BINARY,
                   _services.c.deleted == 0))


@db_api.context_manager.reader
def host_loads(ctx, hosts):
    """Per host: (builds waiting for a node, live instances), one statement
    whose cost grows with the number of hosts and their instances' index
    entries, not rows.

    A build that has no node yet will take one of its host's free nodes.
    """
    hosts = sorted(hosts)
    loads = dict.fromkeys(hosts, (0, 0))
    if not hosts:
        return loads
    statement = _loads_statement(ctx.session.dialect.name)
    for host, waits, count in ctx.session.execute(statement, {'hosts': hosts}):
        loads[host] = (int(waits or 0), count)
    return loads


def _services_and_now(ctx):
    listing = db_services.load_services(ctx, count_nodes=False)
    return listing.rows, listing.now  # the database's clock


class _NoRoom(Exception):
    """No candidate host has a free matching node (nothing written)."""

    def __init__(self, hosts, some_fit):
        super().__init__()
        self.hosts = hosts
        self.some_fit = some_fit  # nodes fit, but builds wait for them all


def _live_hosts(ctx, spec, service_down_time):
    """The services of the request's conductor group that take new work:
    what liveness.is_up says, asked in SQL (its twin db.liveness.up) on
    the database's clock, so that only their names are read (a pure-Python
    driver decodes every value)."""
    rows = ctx.session.execute(
        sa.select(_services.c.host, _services.c.partition_key)
        .where(db_liveness.up(service_down_time)))
    return sorted(host for host, group in rows
                  if spec.partition_key is None
                  or (group or None) == spec.partition_key)


@db_api.context_manager.reader
def _candidates(ctx, spec, service_down_time, host):
    """The hosts a request may go to, judged on the database's clock.

    Without ``host``: the live services (not disabled, not forced down)
    of the request's conductor group. With ``host``: that one, or
    RequestRefused saying which of those checks it fails.
    """
    if host is None:
        return _live_hosts(ctx, spec, service_down_time)
    services, now = _services_and_now(ctx)
    service = next((s for s in services if s.host == host), None)
    if service is None:
        raise exception.RequestRefused(f'no ironic-compute service {host!r}')
    reason = liveness.down_reason(service.record(), now, service_down_time)
    if reason == 'disabled' and service.disabled_reason:
        reason = f'disabled ({service.disabled_reason})'
    if reason is not None:
        raise exception.RequestRefused(f'ironic-compute service {host!r} takes no builds: '
                      f'{reason}')
    group = service.partition_key or None
    if spec.partition_key is not None and group != spec.partition_key:
        manages = (f'conductor group {group}' if group is not None
                   else 'every conductor group')
        raise exception.RequestRefused(f'ironic-compute service {host!r} manages {manages}, '
                      f'not conductor group {spec.partition_key}')
    return [host]


def _free_counts(ctx, spec, loads):
    """{host: free matching nodes} of the hosts of ``loads``, counted up to
    FREE_NODES_COUNTED beyond each host's waiting builds."""
    return node_match.free_counts(
        ctx, spec, {host: waiting + scheduler.FREE_NODES_COUNTED
                    for host, (waiting, _) in loads.items()},
        spec.partition_key)


def _choose(ctx, spec, hosts):
    """The host for ``spec`` among ``hosts``; _NoRoom when none fits.

    Reads O(hosts) rows: the instance counts, and at most
    FREE_NODES_COUNTED free nodes beyond its waiting builds per host. The
    free nodes of the hosts with the fewest instances are counted first:
    when one of them has room, pick_host chooses among them whatever the
    others have, and the others are not read (usually half of the hosts
    or fewer; a second statement counts them when none of the first has
    room).
    """
    loads = host_loads(ctx, hosts)
    first = scheduler.fewest_instances(
        {host: count for host, (_, count) in loads.items()})
    free = _free_counts(ctx, spec, {host: loads[host] for host in first})
    if not any(free.get(host, 0) > loads[host][0] for host in first):
        free.update(_free_counts(ctx, spec, {
            host: load for host, load in loads.items() if host not in first}))
        first = list(loads)
    states = [scheduler.HostState(host, free.get(host, 0) - loads[host][0],
                                  loads[host][1]) for host in first]
    if not any(state.free_nodes > 0 for state in states):
        raise _NoRoom(hosts, some_fit=any(free.values()))
    return scheduler.pick_host(states)


@db_api.writer
def _place(ctx, uuid, name, spec, image_source, hosts, extra):
    """Choose among ``hosts`` and record the request, under the lock."""
    with lock_schedulers(ctx):
        chosen = _choose(ctx, spec, hosts)
        return db_instances.create(ctx, uuid, name, chosen, spec, image_source,
                                   **extra)


@db_api.context_manager.reader
def _why_no_room(ctx, spec, no_room):
    """What did not match, over every node of the candidate hosts."""
    if no_room.some_fit:
        return f'no free node for {spec.describe()} (all are being built on)'
    failed, total = node_match.fail_counts(ctx, spec, no_room.hosts,
                                           spec.partition_key)
    return inst.no_match_fault(spec, failed, total)


def _refusal(ctx, spec, no_room, host, hosts):
    """The exception that says no host has room: RequestRefused for a
    ``host`` asked for, else NoValidHost."""
    # Worded outside the lock: this reads every node of the hosts.
    why = _why_no_room(ctx, spec, no_room)
    if host is not None:
        return exception.RequestRefused(
            f'{why}, on ironic-compute service {host!r}')
    return exception.NoValidHost(f'{why}, on the {len(hosts)} live services')


def candidate_hosts(ctx, spec, service_down_time, host=None):
    """The hosts a request may go to (``host``: that one, checked); raises
    NoValidHost when there is none, RequestRefused when ``host`` fails a
    check."""
    hosts = _candidates(ctx, spec, service_down_time, host)
    if not hosts:
        raise exception.NoValidHost(
            'no live ironic-compute service to build on')
    return hosts


@db_api.context_manager.reader
def _choose_free(ctx, spec, hosts, limit):
    chosen = _choose(ctx, spec, hosts)
    return chosen, node_match.free_nodes(ctx, spec, chosen, limit,
                                         spec.partition_key)


def choose_with_free_nodes(ctx, spec, hosts, limit, host=None):
    """(the host the scheduler chooses among ``hosts``, the uuids of up to
    ``limit`` of its free matching nodes), read without the schedulers'
    lock: what ``instance create`` claims among in Placement before the
    row is recorded (create_on_node). Raises NoValidHost (RequestRefused
    for a ``host`` asked for) when none has a free matching node."""
    try:
        return _choose_free(ctx, spec, hosts, limit)
    except _NoRoom as no_room:
        refusal = _refusal(ctx, spec, no_room, host, hosts)
    raise refusal


@db_api.writer
def _insert_on_node(ctx, uuid, name, spec, image_source, host, node, extra):
    with lock_schedulers(ctx):
        return db_instances.create(ctx, uuid, name, host, spec, image_source,
                                   node=node, **extra)


def create_on_node(ctx, uuid, name, spec, image_source, host, node,
                   **extra):
    """Record the request for ``host`` on ``node`` (claimed for it), under
    the schedulers' lock, so that a scheduler counting free nodes meanwhile
    sees it whole. Raises NodeTaken when a live instance is recorded on the
    node, RequestRefused when the lock stays busy; writes nothing then."""
    try:
        return _insert_on_node(ctx, uuid, name, spec, image_source, host,
                               node, extra)
    except exception.LockBusy as exc:
        raise exception.RequestRefused(str(exc)) from None
    except db_exc.DBDuplicateEntry as exc:
        raise exception.NodeTaken(
            f'node {node} is recorded for another live instance') from exc


def schedule_and_create(ctx, uuid, name, spec, image_source,
                        service_down_time, host=None, **extra):
    """Choose the host (or check the one given) and record the request
    (with ``extra``, the columns db_instances.create records unmatched).

    The candidates are read first, in a transaction of their own; the
    choice and the insert are made under the schedulers' lock
    (:func:`lock_schedulers`), so two requests made at once never count
    the same free node. Raises exception.NoValidHost, or
    exception.RequestRefused for ``host`` (and when the lock stays busy),
    writing nothing.
    """
    hosts = candidate_hosts(ctx, spec, service_down_time, host)
    try:
        return _place(ctx, uuid, name, spec, image_source, hosts, extra)
    except exception.LockBusy as exc:
        raise exception.RequestRefused(str(exc)) from None
    except _NoRoom as no_room:
        refusal = _refusal(ctx, spec, no_room, host, hosts)
    raise refusal
