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

"""Do the database and Ironic agree on which node serves which instance?

Issue 21's promise, checked from outside the services: at every sample,

``active_not_deployed``
    every instance the database has ``active`` with no task (and a build
    request: records made by ``instance add`` describe instances built
    elsewhere and are not checked) is on its ``node``, which Ironic has
    ``active``, not moving, with ``instance_uuid`` = the instance;
``serves_deleted``
    no node is deployed, allocated or being torn down for an instance the
    database knows deleted. The one legitimate moment: a node whose
    instance record was removed while it was built (``instance remove``)
    is torn down by the reaper a cycle or two later, and that teardown
    takes the fake deploy's time: allowed for ``teardown_grace`` seconds
    after ``deleted_at``, on the database's clock;
``serves_failed``
    ... nor for an instance in ``error`` with no node and no task (a
    failed build frees its node before it writes the error);
``serves_elsewhere``
    ... nor for an instance whose live row names another node. A build in
    flight (task ``scheduled``/``spawning``) has its allocation before its
    row names the node, so a row without a node is not this;
``serves_unknown``
    ... nor for an instance this database never had (the tests make no
    such node);
``two_allocations``
    no instance has two allocations or two nodes (allocations are named,
    and have the uuid of, their instance; two nodes must never carry one
    ``instance_uuid``).

A sample reads the database first (one SELECT of every ``instances`` row,
deleted too, and the database's time), then Ironic (the nodes, then the
allocations). Every change the services make that touches both goes to
Ironic first and records it after (a build is recorded active once Ironic
says so, a deleted or failed instance once its node is clean), or records
an intent first that the rules above allow (``deleting``, a build's task):
read in this order, a sample never sees a legitimate step as a violation,
but for one: a build recorded after the database read whose worker has
allocated a node before Ironic is read. So the instances Ironic has
something for and the sample has no row of are looked up in the database
once more, after Ironic (``recorded_since``).

:func:`check` is pure; :class:`Agreement` reads, checks and keeps what it
found, and a sampler calls it at each sample (:meth:`Agreement.read_database`
inside the sample's connection, :meth:`Agreement.sample` after it).
:func:`quiet` is the strict check once a run has settled.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import sqlalchemy as sa

from tests.functional import daemons
from tests.functional import ironic_env

NODE_FIELDS = ('uuid', 'provision_state', 'target_provision_state', 'instance_uuid',
               'power_state')
IN_FLIGHT = ('scheduled', 'spawning')
# The vm_states of an instance whose node Ironic has deployed for it.
DEPLOYED = ('active', 'stopped')
RULES = ('active_not_deployed', 'serves_deleted', 'serves_failed', 'serves_elsewhere',
         'serves_unknown', 'two_allocations')

_instances = sa.table('instances', sa.column('uuid'), sa.column('host'), sa.column('node'),
                      sa.column('vm_state'), sa.column('task_state'), sa.column('name'),
                      sa.column('deleted'), sa.column('deleted_at'))


@dataclasses.dataclass(frozen=True)
class Row:
    """One ``instances`` row, as the checker needs it."""

    uuid: str
    host: str | None
    node: str | None
    vm_state: str | None
    task_state: str | None
    built_here: bool  # a build request (not an ``instance add`` record)
    deleted_at: object  # naive UTC datetime, None while live


@dataclasses.dataclass
class Sample:
    """What one sample read: the database, then Ironic."""

    db_now: object  # naive UTC datetime, the database's clock
    rows: list  # [Row], live and deleted
    nodes: dict  # {node uuid: {field: value}} of the nodes under watch
    allocations: list  # [{uuid, name, node_uuid, state}]


def read_database(conn):
    """``(db_now, [Row])``: every instance row, deleted too, and the time."""
    from ironic_compute.db import clock

    now = conn.execute(sa.select(clock.utc_now())).scalar_one()
    t = _instances
    rows = conn.execute(sa.select(t.c.uuid, t.c.host, t.c.node, t.c.vm_state, t.c.task_state,
                                  t.c.name, t.c.deleted, t.c.deleted_at)).all()
    return now, [Row(r.uuid, r.host, r.node, r.vm_state, r.task_state, r.name is not None,
                     r.deleted_at if r.deleted else None) for r in rows]


def read_ironic(client, watched):
    """``(nodes, allocations)`` of the ``watched`` node uuids.

    The listing asks for :data:`NODE_FIELDS` only (``allocation_uuid`` is
    refused as a field of a listing); every allocation is read, and kept
    when it is on a watched node or has no node (a failed one).
    """
    nodes = {n['uuid']: n for n in ironic_env.list_nodes(client, fields=NODE_FIELDS)
             if n['uuid'] in watched}
    allocations = [a for a in ironic_env.list_allocations(client)
                   if a.get('node_uuid') is None or a['node_uuid'] in watched]
    return nodes, allocations


def _claims(sample):
    """{instance uuid: {(what, node)}}: every node and allocation Ironic has
    for an instance ('node': its instance_uuid; 'allocation': by name)."""
    claims = collections.defaultdict(set)
    for uuid, node in sample.nodes.items():
        if node.get('instance_uuid'):
            claims[node['instance_uuid']].add(('node', uuid))
    for allocation in sample.allocations:
        claims[allocation['name'] or allocation['uuid']].add(
            ('allocation', allocation.get('node_uuid')))
    return claims


def unknown_instances(sample):
    """The instances Ironic has something for that the sample's database
    read has no row of, live or deleted."""
    return set(_claims(sample)) - {r.uuid for r in sample.rows}


def check(sample, teardown_grace, recorded_since=frozenset()):
    """The violations in ``sample``: ``[(rule, detail)]`` (see the module).

    ``recorded_since``: instances whose rows the database has now, read
    after Ironic, though the sample's database read had none: recorded
    between the two reads (a build whose worker allocated a node before
    Ironic was read), so not unknown."""
    found = []
    live = {r.uuid: r for r in sample.rows if r.deleted_at is None}
    deleted = {r.uuid: r for r in sample.rows if r.deleted_at is not None}
    for row in live.values():
        if not (row.built_here and row.vm_state in DEPLOYED
                and row.task_state is None):
            continue
        node = sample.nodes.get(row.node) if row.node else None
        state = node and (node['provision_state'], node['target_provision_state'],
                          node['instance_uuid'])
        if state != ('active', None, row.uuid):
            found.append(('active_not_deployed',
                          f'{row.uuid} active on {row.node} ({row.host}); Ironic: {state}'))
    claims = _claims(sample)
    for instance, held in claims.items():
        nodes = {node for what, node in held if what == 'node'}
        allocations = [node for what, node in held if what == 'allocation']
        if len(nodes) > 1 or len(allocations) > 1:
            found.append(('two_allocations', f'{instance}: {sorted(map(str, held))}'))
        row = live.get(instance)
        if row is None:
            gone = deleted.get(instance)
            if gone is None:
                if instance not in recorded_since:
                    found.append(('serves_unknown',
                                  f'{instance}: {sorted(map(str, held))}'))
            elif (sample.db_now - gone.deleted_at).total_seconds() > teardown_grace:
                found.append(('serves_deleted', f'{instance} deleted at {gone.deleted_at}, '
                              f'now {sample.db_now}: {sorted(map(str, held))}'))
            continue
        if row.vm_state == 'error' and row.node is None and row.task_state is None:
            found.append(('serves_failed', f'{instance} ({row.host}, fault written): '
                          f'{sorted(map(str, held))}'))
            continue
        elsewhere = {node for _, node in held if node is not None and node != row.node}
        if elsewhere and not (row.node is None and row.task_state in IN_FLIGHT):
            found.append(('serves_elsewhere', f'{instance} on {row.node} '
                          f'({row.vm_state}/{row.task_state}, {row.host}); Ironic also has '
                          f'it on {sorted(elsewhere)}'))
    return found


def quiet(sample, free_states=('available',)):
    """The strict check once a run has settled: ``[(rule, detail)]``.

    Every live instance is active or in error with no task (``unsettled``
    otherwise); Ironic has exactly the active instances built here, each on
    its node with its allocation, and nothing else: a node that serves no
    live active instance has no instance, no allocation, no target state,
    and a state of ``free_states`` (``not_free``).
    """
    found = check(sample, teardown_grace=0)
    live = {r.uuid: r for r in sample.rows if r.deleted_at is None}
    for row in live.values():
        if row.task_state is not None or row.vm_state not in (*DEPLOYED, 'error'):
            found.append(('unsettled', f'{row.uuid}: {row.vm_state}/{row.task_state}'))
    serving = {r.node: r.uuid for r in live.values()
               if r.built_here and r.vm_state in DEPLOYED and r.node}
    # Settled, an active instance runs and a stopped one does not.
    for row in live.values():
        node = sample.nodes.get(row.node) if row.node else None
        want = {'active': 'power on', 'stopped': 'power off'}.get(row.vm_state)
        if (row.built_here and want and node is not None
                and node.get('power_state', want) != want):
            found.append(('wrong_power', f'{row.uuid} {row.vm_state} on {row.node}: '
                          f'Ironic says {node.get("power_state")}'))
    allocated = {a.get('node_uuid'): a for a in sample.allocations}
    for uuid, node in sample.nodes.items():
        allocation = allocated.get(uuid)
        owner = serving.get(uuid)
        if owner is not None:
            if allocation is None or allocation['uuid'] != owner:
                found.append(('active_not_deployed',
                              f'{owner} on {uuid}: allocation {allocation}'))
        elif (node['instance_uuid'] or allocation or node['target_provision_state']
              or node['provision_state'] not in free_states):
            found.append(('not_free', f'{uuid}: {node}, allocation {allocation}'))
    for allocation in sample.allocations:
        if allocation.get('node_uuid') is None:
            found.append(('not_free', f'an allocation without a node: {allocation}'))
    return found


class Findings:
    """What a sampling checker found: ``found``, {rule: [(read_at,
    detail)]}, guarded by ``_lock``; ``rules`` names every rule it checks."""

    rules = ()

    def violations(self):
        """{rule: 'N samples, first: [...]'}; {} when all agreed."""
        with self._lock:
            return {rule: f'{len(hits)} samples, first: {hits[:3]}'
                    for rule, hits in self.found.items() if hits}

    def violation_times(self):
        """``(read_at, rule)`` of every violation seen."""
        with self._lock:
            return sorted((read_at, rule) for rule, hits in self.found.items()
                          for read_at, _ in hits)

    def counts(self):
        """{rule: how many samples showed it} for every rule."""
        with self._lock:
            return {rule: len(self.found.get(rule, ())) for rule in self.rules}


class Agreement(Findings):
    """Samples and what they found, for a sampler thread and a test.

    ``watched()`` returns the node uuids under watch (a callable: a test may
    delete and re-create nodes). A sample whose Ironic read fails counts in
    ``ironic_errors`` and checks nothing.
    """

    rules = RULES

    def __init__(self, client, watched, teardown_grace):
        self.client = client
        self.watched = watched
        self.teardown_grace = teardown_grace
        self.samples = 0
        self.ironic_errors = 0
        self.found = collections.defaultdict(list)  # rule -> [(read_at, detail)]
        self.last = None  # the last Sample
        self.last_ironic_error = None  # why the last failed Ironic read failed
        self._lock = threading.Lock()

    def read(self, db_part):
        """A Sample from a :func:`read_database` result and a fresh Ironic read,
        or None when Ironic did not answer."""
        try:
            nodes, allocations = read_ironic(self.client, set(self.watched()))
        except Exception as exc:  # noqa: BLE001 - an unreachable Ironic skips a sample
            with self._lock:
                self.ironic_errors += 1
                self.last_ironic_error = f'{type(exc).__name__}: {exc}'
            return None
        db_now, rows = db_part
        return Sample(db_now, rows, nodes, allocations)

    def sample(self, read_at, db_part, recorded=None):
        """Read Ironic, check the pair, keep the violations; the Sample
        (None when Ironic did not answer). ``recorded(uuids)``, if given,
        says which of ``uuids`` have an instance row now: an instance
        recorded after the database read is not unknown."""
        sample = self.read(db_part)
        if sample is None:
            return None
        unknown = unknown_instances(sample)
        recorded_since = recorded(unknown) if unknown and recorded else set()
        violations = check(sample, self.teardown_grace, recorded_since)
        with self._lock:
            self.samples += 1
            self.last = sample
            for rule, detail in violations:
                self.found[rule].append((read_at, detail))
        return sample

    def fresh(self, engine, attempts=3, pause=1.0):
        """A Sample read now (database, then Ironic), outside the sampler.

        A pair whose Ironic read fails is read again, both parts, up to
        ``attempts`` times ``pause`` seconds apart: under the functional
        suite's load Ironic's API may drop a request now and then (seen on
        CI: test_fencing's settle, once), and a check that reads the pair
        again loses nothing. Raises AssertionError naming the last error
        when no attempt got an answer."""
        for attempt in range(attempts):
            if attempt:
                time.sleep(pause)
            with engine.connect() as conn:
                db_part = read_database(conn)
            sample = self.read(db_part)
            if sample is not None:
                return sample
        raise AssertionError(f'Ironic did not answer the agreement check '
                             f'{attempts} times; last: {self.last_ironic_error}')


class AgreementSampler(daemons.InstanceSampler):
    """An InstanceSampler that also checks :class:`Agreement` at every sample.

    The database part is read in the sample's connection, after the
    instance sampler's own reads; Ironic right after the connection is
    released. What a subclass's ``_read_more`` gets from this one is opaque:
    it hands it back to ``_check_more`` as it came. ``placement`` (a
    placement_agreement.PlacementAgreement, or None) checks Placement right
    after Ironic, from the same sample.
    """

    def __init__(self, url, agreement, interval, placement=None):
        super().__init__(url, interval)
        self.agreement = agreement
        self.placement = placement

    def _read_more(self, conn):
        return super()._read_more(conn), read_database(conn)

    def _check_more(self, read_at, services, more):
        rest, db_part = more
        super()._check_more(read_at, services, rest)
        sample = self.agreement.sample(read_at, db_part, self._recorded)
        if self.placement is not None:
            self.placement.sample(read_at, sample)

    def _recorded(self, uuids):
        """Which of ``uuids`` have an instance row now, deleted or not."""
        t = _instances
        with self.engine.connect() as conn:
            return set(conn.execute(sa.select(t.c.uuid).where(
                t.c.uuid.in_(sorted(uuids)))).scalars())

    def violations(self):
        found = super().violations()
        found.update({f'agreement: {rule}': text
                      for rule, text in self.agreement.violations().items()})
        if self.placement is not None:
            found.update({f'placement: {rule}': text
                          for rule, text in self.placement.violations().items()})
        return found
