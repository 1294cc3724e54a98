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

"""The chaos soak's machinery: its settings, its sampler and the Soak fleet.

tests/functional/test_chaos.py says what the soak does and checks;
chaos_faults.py holds the faults, one function each. Soak is the fleet of
five daemons with their proxies, what the faults have changed (records,
builds, conductor groups) and the convergence after each fault: every node
owned by a live service of its group, measured from the samples.
"""

import collections
import dataclasses
import os
import random
import time
import uuid as uuidlib

import sqlalchemy as sa

from ironic_compute.db import clock
from ironic_compute.nodes import ownership
from tests.functional import agreement
from tests.functional import daemons
from tests.functional import ironic_env
from tests.functional import placement_agreement

MINUTES = float(os.environ.get('IC_CHAOS_MINUTES') or 3)
REPORT_INTERVAL = 1
SERVICE_DOWN_TIME = 8
CYCLE = 2  # update_resources_interval
SAMPLE_PERIOD = 0.3
# The bounds, from the end of a fault.
BOUND = SERVICE_DOWN_TIME + 2 * CYCLE + 2
STOP_BOUND = 2 * CYCLE + 2  # a clean stop: the peers' next cycle
# How long past its bound a convergence is waited for, so that a late one
# is measured and reported instead of timing out.
OVERTIME = 20
GROUPS = {'group-a': ('compute-1', 'compute-2', 'compute-3'),
          'group-b': ('compute-4', 'compute-5')}
NODES = {'group-a': 24, 'group-b': 16}
HOSTS = tuple(h for hosts in GROUPS.values() for h in hosts)
LOAD_FACTOR = 1.10
PARTITION_EXPONENT = 12
MAX_INSTANCES = 3  # records (instance add) and builds, each
BUILDABLE = 6  # nodes per group that a build can take
BUILD_WAIT = 60
# A node whose instance record was removed is torn down by the reaper at
# its owner's next cycle or two; the fake deploy interface tears down at once.
TEARDOWN_GRACE = 3 * CYCLE
# Placement (placement_agreement.py): a claim of an instance deleted while
# its host was down goes right after its node's teardown; instance create
# claims before it records the row, and gives the claim back at once when
# it records nothing.
CLAIM_GRACE = TEARDOWN_GRACE + CYCLE
CREATE_WINDOW = 10
# Longer than any other fault keeps a host silent, so that only the
# 'instance takeover' fault moves instances (the pins follow the database
# after every fault all the same).
TAKEOVER_GRACE = 30
TAKEOVER_BOUND = SERVICE_DOWN_TIME + TAKEOVER_GRACE + 2 * CYCLE + 2
SYNC_POWER_STATE_INTERVAL = 10
KINDS = ('kill -9', 'SIGTERM', 'SIGSTOP', 'SIGHUP', 'DB cut', 'Ironic cut',
         'group change', 'node re-created', 'instance add', 'instance remove',
         'instance build', 'instance delete', 'instance action',
         'instance takeover')


def seed():
    value = os.environ.get('IC_CHAOS_SEED')
    return int(value) if value else random.SystemRandom().randrange(10 ** 6)


class ChaosSampler(agreement.AgreementSampler):
    """An AgreementSampler that also judges liveness on the database's clock.

    Per sample it keeps ``(read_at, owners, up_hosts, heartbeats)`` in
    ``liveness``: the hosts that are up as their peers judge them (not
    stopped, disabled or forced down, heartbeat within service_down_time of
    the database's time) and each host's ``last_seen_up``. One more check:

    ``pin_breaks``: an instance's node, once seen with the instance's host,
        later seen with another holder while the instance record exists, in
        two samples in a row (a takeover moves the instance and its node's
        row in one transaction, which one sample's two SELECTs may straddle).
        Nobody may take a node whose instance another service manages.
    """

    def __init__(self, url, checker, placement=None):
        super().__init__(url, checker, interval=SAMPLE_PERIOD, placement=placement)
        self.liveness = []  # (read_at, owners, frozenset(up), {host: last_seen_up})
        self.pin_breaks = []  # (read_at, instance, node, host, holder)
        self._pinned = set()  # instances whose node was seen with their host
        self._suspects = set()  # (uuid, host, holder) of the last sample
        self._services_state = sa.table(
            'services', sa.column('host'), sa.column('last_seen_up'),
            sa.column('stopped_at'), sa.column('disabled'), sa.column('forced_down'),
            sa.column('deleted'))

    def _read_more(self, conn):
        instances = super()._read_more(conn)
        table = self._services_state
        now = conn.execute(sa.select(clock.utc_now())).scalar_one()
        services = conn.execute(
            sa.select(table.c.host, table.c.last_seen_up, table.c.stopped_at,
                      table.c.disabled, table.c.forced_down)
            .where(table.c.deleted == 0)).all()
        return instances, now, services

    def _check_more(self, read_at, services, more):
        instances, now, states = more
        super()._check_more(read_at, services, instances)
        up = frozenset(
            host for host, seen, stopped, disabled, forced in states
            if seen is not None and stopped is None and not disabled and not forced
            and (now - seen).total_seconds() <= SERVICE_DOWN_TIME)
        heartbeats = {host: seen for host, seen, *_ in states}
        with self._lock:
            owners = self.history[-1][1]
            self.liveness.append((read_at, owners, up, heartbeats))
            current = self.instance_history[-1][1]
            suspects = set()
            for uuid, (host, node, _vm, _task) in current.items():
                if node is None:
                    continue
                holder = owners.get(node)
                if holder == host:
                    self._pinned.add(uuid)
                elif uuid in self._pinned:
                    suspects.add((uuid, host, holder))
                    if (uuid, host, holder) in self._suspects:
                        self.pin_breaks.append((read_at, uuid, node, host, holder))
            self._suspects = suspects
            self._pinned &= current.keys()

    def violations(self):
        found = super().violations()
        with self._lock:
            if self.pin_breaks:
                found['pin_breaks'] = (f'{len(self.pin_breaks)} samples, '
                                       f'first: {self.pin_breaks[:3]}')
        return found

    def violation_times(self):
        """``(read_at, check)`` of every sample that showed a violation."""
        with self._lock:
            return sorted((entry[0], name) for name, entries in (
                ('lost', self.lost), ('unknown_owners', self.unknown_owners),
                ('duplicates', self.duplicates), ('homeless', self.homeless),
                ('shared_nodes', self.shared_nodes), ('doubled', self.doubled),
                ('lost_instances', self.lost_instances), ('pin_breaks', self.pin_breaks))
                for entry in entries) + self.agreement.violation_times() + (
                    self.placement.violation_times() if self.placement else [])

    def first(self, predicate, since):
        """``(read_at, previous_read_at)`` of the first sample after ``since``
        for which ``predicate(owners, up_hosts, heartbeats)`` holds, or None."""
        with self._lock:
            samples = list(self.liveness)
        previous = since
        for read_at, owners, up, heartbeats in samples:
            if read_at <= since:
                continue
            if predicate(owners, up, heartbeats):
                return read_at, previous
            previous = read_at
        return None

    def last_heartbeat(self, host):
        """``host``'s last_seen_up in a sample taken after this call."""
        start = self.samples
        daemons.wait_until(lambda: self.samples > start + 1, 10, 0.05, 'a new sample')
        with self._lock:
            return self.liveness[-1][3].get(host)


@dataclasses.dataclass
class Measure:
    """One convergence: from ``since`` (the end of a fault) to the first
    sample where every node is owned by a live service of its group."""

    label: str
    fault: int  # index in Soak.timeline
    since: float
    bound: float
    seconds: float | None = None  # None: not within bound + OVERTIME
    allowed: float | None = None  # bound + sampling + slow cycles
    settled: float | None = None  # seconds until the rules' placement
    target: dict | None = None  # the rules' placement after this fault

    @property
    def ok(self):
        return self.seconds is not None and self.seconds <= self.allowed


class Soak(daemons.BackendFleet):
    """Five daemons on one database and the real Ironic, each behind proxies of its own,
    and what the faults have changed; the faults are in chaos_faults.py."""

    def __init__(self, backend, workdir, ironic, rng, seed_value, placement=None):
        # The daemons report to ``placement``, and the CLI's creates claim
        # there (chaos_placement.py and placement_agreement.py check it).
        self.placement = placement
        self.recreated = set()  # nodes deleted and re-created in Ironic
        super().__init__(backend, workdir, ironic, manage_options={
            'service_down_time': SERVICE_DOWN_TIME, 'report_interval': REPORT_INTERVAL})
        if placement is not None:
            # instance create claims its node in Placement (before it
            # records the row), as in a cloud that runs Placement.
            with open(self.manage_config, 'a') as f:
                f.write(daemons.config_text({'placement': placement.config()}))
        self.rng = rng
        self.seed = seed_value
        self.failures = []  # one line each
        self.measures = []
        self.timeline = []  # (monotonic start, label) of each fault
        self.instances = {}  # instance uuid -> (host, node): records added
        self.built = {}  # instance uuid -> (host, node): instances built
        self.group_of = {}  # node uuid -> conductor group (as the soak set it)
        self.fault = 'start-up'
        self.passed = False
        self.db_proxies, self.ironic_proxies = {}, {}
        for group, hosts in GROUPS.items():
            for host in hosts:
                db_proxy = daemons.TcpProxy.to(self.database.url)
                ironic_proxy = daemons.TcpProxy.to(ironic.url)
                self.db_proxies[host], self.ironic_proxies[host] = db_proxy, ironic_proxy
                self.add(host, self._options(host, group, db_proxy.reach(self.database.url),
                                             ironic_proxy.port))
        prefix = f'chaos-{backend}-{uuidlib.uuid4().hex[:6]}'
        for group, count in NODES.items():
            uuids = ironic_env.create_nodes(self.client, count, group,
                                            name_prefix=f'{prefix}-{group}')
            self.nodes += uuids
            ironic_env.make_buildable(self.client, uuids[:BUILDABLE])
            for uuid in uuids:
                self.group_of[uuid] = group
        # A re-created node keeps its uuid: the watched nodes never change.
        watched = frozenset(self.group_of)
        self.agreement = agreement.Agreement(ironic.client(timeout=5), lambda: watched,
                                             TEARDOWN_GRACE)
        # A provider of a node gone from Ironic goes at its owner's next
        # cycle, or its successor's when the owner has just died: BOUND.
        self.placement_agreement = placement and placement_agreement.PlacementAgreement(
            placement.database.url, stale_bound=BOUND, create_window=CREATE_WINDOW,
            claim_grace=CLAIM_GRACE)
        self.sampler = ChaosSampler(self.database.url, self.agreement,
                                    self.placement_agreement)

    def _options(self, host, group, db_url, ironic_port):
        return {
            'DEFAULT': {
                'host': host, 'report_interval': REPORT_INTERVAL,
                'service_down_time': SERVICE_DOWN_TIME,
                'update_resources_interval': CYCLE,
                'graceful_shutdown_timeout': 20, 'state_path': self.workdir,
                'debug': 'false', 'instance_takeover_grace': TAKEOVER_GRACE,
                'sync_power_state_interval': SYNC_POWER_STATE_INTERVAL,
            },
            'database': {'connection': db_url, 'max_retries': 3, 'retry_interval': 1},
            'ironic': {
                'auth_type': 'none',
                'endpoint_override': f'http://127.0.0.1:{ironic_port}',
                'partition_key': group, 'api_max_retries': 0,
                'api_retry_interval': 0, 'timeout': 5,
            },
            'hash_ring': {'partition_exponent': PARTITION_EXPONENT,
                          'load_factor': LOAD_FACTOR},
            **({'placement': self.placement.config()} if self.placement else {}),
        }

    # -- plumbing ---------------------------------------------------------

    def manage(self, *args):
        return super().manage(*args, timeout=60)

    def start(self):
        """``db sync``, the sampler, then the daemons (the sampler sees them start)."""
        sync = self.manage('db', 'sync')
        assert sync.returncode == 0, sync.stderr
        self.sampler.start()
        for daemon in self.daemons.values():
            daemon.start()

    def fail(self, message):
        line = f'[seed {self.seed}, fault {len(self.timeline)} {self.fault!r}] {message}'
        print('FAILURE', line, flush=True)
        self.failures.append(line)

    def check_daemons(self):
        """No daemon exited unless the soak stopped it (a failure otherwise)."""
        for host, daemon in self.daemons.items():
            if not daemon.expected_down and not daemon.alive:
                self.fail(f'{host} exited by itself with {daemon.process.returncode}: '
                          f'{daemon.log()[-1500:]}')
                daemon.expected_down = True  # reported once; restarted below
                daemon.start()

    def sleep(self, seconds):
        """Sleep, checking the daemons every half second."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.check_daemons()
            time.sleep(min(0.5, left))

    def begin(self, label):
        self.fault = label
        self.timeline.append((time.monotonic(), label))
        print(f'{time.strftime("%H:%M:%S")} fault {len(self.timeline)}: {label}', flush=True)

    def pins(self):
        """{node: host} of the records added and the instances built."""
        return {node: host for host, node in (*self.instances.values(),
                                              *self.built.values())}

    def unpinned_nodes(self):
        pinned = self.pins()
        return sorted(u for u in self.group_of if u not in pinned)

    # -- convergence ------------------------------------------------------

    def converged(self, down=()):
        """A predicate: every node owned by a live service of its group.

        A node an instance pins must be with the instance's host, and that
        host live unless the soak keeps it ``down`` (its peers never take
        such a node). ``down`` hosts count as dead whatever their heartbeat.
        """
        pins = self.pins()
        group_of = dict(self.group_of)

        def predicate(owners, up, _heartbeats):
            live = up - set(down)
            for uuid, group in group_of.items():
                holder = owners.get(uuid)
                pin = pins.get(uuid)
                if pin is not None:
                    if holder != pin or (pin not in live and pin not in down):
                        return False
                elif holder not in live or holder not in GROUPS[group]:
                    return False
            return True
        return predicate

    def converge(self, label, since, bound, down=()):
        """Wait until the nodes are owned by live services; record how long."""
        measure = Measure(label, len(self.timeline) - 1, since, bound)
        self.measures.append(measure)
        predicate = self.converged(down)
        deadline = since + bound + OVERTIME
        found = None
        while found is None:
            self.check_daemons()
            found = self.sampler.first(predicate, since)
            if found is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(SAMPLE_PERIOD)
        if found is None:
            self.fail(f'{label}: nodes not owned by live services of their group '
                      f'{bound + OVERTIME} s after the end of the fault '
                      f'(bound {bound} s); owners now: {self.owner_counts()}')
            return measure
        read_at, previous = found
        measure.seconds = read_at - since
        # Slack the bound does not cover (see test_daemons'
        # test_kill9_fails_over_and_restart_rebalances): the
        # sampling period, and cycles slower than half an interval on a
        # loaded machine (each of the two cycles in the bound may run long).
        hosts = set(HOSTS) - set(down)
        runs = self.sampler.cycle_seconds(hosts, since, read_at + CYCLE)
        slow = max(0.0, 2 * max(runs, default=0.0) - CYCLE)
        measure.allowed = bound + (read_at - previous) + slow
        if not measure.ok:
            self.fail(f'{label}: nodes owned by live services after {measure.seconds:.1f} s, '
                      f'allowed {measure.allowed:.1f} s (bound {bound} s, slowest cycle '
                      f'{max(runs, default=0.0):.2f} s)')
        return measure

    def target(self):
        """Where the rules put every node now that every daemon is up."""
        instances = [ownership.InstanceInfo(i, host, node)
                     for i, (host, node) in (*self.instances.items(), *self.built.items())]
        placement = {}
        for group, hosts in GROUPS.items():
            listed = [ownership.NodeInfo(n['uuid'], n.get('instance_uuid'), group)
                      for n in ironic_env.list_nodes(
                          self.client, fields=['uuid', 'instance_uuid'],
                          conductor_group=group)]
            ring = ownership.node_ring(ownership.build_ring(hosts, PARTITION_EXPONENT),
                                       listed, instances, LOAD_FACTOR)
            mine = [n.uuid for n in listed if self.group_of.get(n.uuid) == group]
            for node in mine:
                placement[node] = ownership.node_manager(
                    ownership.NodeInfo(node), ring,
                    *ownership.index_instances(instances))[0]
        return placement

    def refresh_pins(self):
        """The instances' hosts as the database has them: a takeover moves
        an instance (and the node it pins) to a live host."""
        rows = self.sampler.instances()
        for records in (self.instances, self.built):
            for uuid in list(records):
                if uuid in rows:
                    records[uuid] = rows[uuid][:2]

    def after(self, label, since, bound=BOUND):
        """The end of a fault: converge, then note where the rules put the nodes."""
        self.refresh_pins()
        measure = self.converge(label, since, bound)
        measure.target = self.target()
        return measure

    def owner_counts(self):
        return dict(collections.Counter(self.sampler.snapshot().get(u)
                                        for u in self.group_of))

    def close(self):
        super().close(*self.db_proxies.values(), *self.ironic_proxies.values())
        if self.placement_agreement is not None:
            self.placement_agreement.close()
        if self.placement is not None:
            self.placement.delete_providers(list(self.group_of))
