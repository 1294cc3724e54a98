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

"""Several real ironic-compute processes on MariaDB and PostgreSQL.

Four daemons share a real Ironic: three manage conductor group "group-a",
one manages "group-b". A sampler reads compute_nodes continuously; the
tests kill, stop, restart and reconfigure daemons, change nodes in Ironic,
and cut the database and Ironic off through TCP proxies, checking after
each step who owns what and that no node was ever owned twice or lost.
The tests of a class share one cluster (starting four daemons and 129 nodes
costs half a minute); each starts from the state :meth:`Cluster.ready`
builds, so any one of them runs alone.
"""

import math
import os
import signal
import socket
import time
import uuid as uuidlib

import sqlalchemy as sa

from ironic_compute.nodes import ownership
from ironic_compute.ring import hash_ring
from tests.functional import daemons
from tests.functional import ironic_env

REPORT_INTERVAL = 1
SERVICE_DOWN_TIME = 8
CYCLE = 1  # update_resources_interval
# The bound: after kill -9 the survivors own the victim's nodes
# within service_down_time + 2 intervals. The kill -9 test asserts it on the measured
# time, with the only slack it explains; it waits longer than that so that
# a late failover is measured and reported instead of timing out.
KILL_FAILOVER_BOUND = SERVICE_DOWN_TIME + 2 * CYCLE
KILL_FAILOVER_WAIT = KILL_FAILOVER_BOUND + 10
# A service that stopped cleanly is gone at the survivors' next cycle.
STOP_FAILOVER = 2 * CYCLE + 2
# Enough nodes for "spread close to evenly" to be testable (see
# test_all_start_and_share_the_partition);
# each more costs about 0.1 s of node creation and deletion per backend.
GROUP_A_NODES = 120
GROUP_B_NODES = 9
A_HOSTS = ('compute-1', 'compute-2', 'compute-3')
LOAD_FACTOR = 1.10  # [hash_ring]load_factor of the daemons


class NotifySocket:
    """A real NOTIFY_SOCKET datagram socket, as systemd provides."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages = []

    def drain(self):
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                return self.messages

    def close(self):
        self.sock.close()


class Cluster(daemons.BackendFleet):
    def __init__(self, backend, workdir, ironic):
        super().__init__(backend, workdir, ironic, daemons.OwnershipSampler)
        self.prefix = f'fn-{backend}-{uuidlib.uuid4().hex[:6]}'
        self.db_proxy = daemons.TcpProxy.to(self.database.url)
        self.daemon_db_url = self.db_proxy.reach(self.database.url)
        self.ironic_proxy = daemons.TcpProxy.to(ironic.url)
        self.group_a = ironic_env.create_nodes(self.client, GROUP_A_NODES, 'group-a',
                                               name_prefix=self.prefix + '-a')
        self.group_b = ironic_env.create_nodes(self.client, GROUP_B_NODES, 'group-b',
                                               name_prefix=self.prefix + '-b')
        self.nodes = self.group_a + self.group_b
        for name in ('Compute-1', 'compute-2', 'compute-3'):
            self._daemon(name, 'group-a')
        self._daemon('compute-4', 'group-b', peer_list='compute-3,compute-4')
        self.notify = NotifySocket(os.path.join(workdir, 'notify.sock'))
        self.placed = {}  # instance: node, of place_instance
        self.baseline = None
        self.daemons['compute-1'].env = {'NOTIFY_SOCKET': self.notify.path,
                                         'WATCHDOG_USEC': '30000000'}

    def _daemon(self, host, group, peer_list=None):
        ironic_opts = {
            'auth_type': 'none',
            'endpoint_override': self.ironic_proxy.reach(self.ironic.url),
            'partition_key': group,
            'api_max_retries': 0,
            'api_retry_interval': 0,
            'timeout': 5,
        }
        if peer_list:
            ironic_opts['peer_list'] = peer_list
        options = {
            'DEFAULT': {
                'host': host,
                'report_interval': REPORT_INTERVAL,
                'service_down_time': SERVICE_DOWN_TIME,
                'update_resources_interval': CYCLE,
                'graceful_shutdown_timeout': 20,
                'state_path': self.workdir,
            },
            'database': {'connection': self.daemon_db_url, 'max_retries': 3,
                         'retry_interval': 1},
            'ironic': ironic_opts,
            'hash_ring': {'partition_exponent': 12, 'load_factor': LOAD_FACTOR},
        }
        return self.add(host, options)

    def ready(self):
        """Build the state every test starts from; return its ownership.

        Ironic and the database reachable, no instance placed, each node in
        Ironic, the four daemons running with their first settings, every
        node settled where the ring puts it and ``baseline`` that ownership.
        In a run of the whole class this finds it all so already: each test
        leaves the cluster as it found it.
        """
        self.db_proxy.up()
        self.ironic_proxy.up()
        for instance, node in list(self.placed.items()):
            self.remove_instance(instance, node)
        listed = {n['uuid'] for n in ironic_env.list_nodes(self.client, fields=['uuid'])}
        for uuid in self.group_a + self.group_b:
            if uuid not in listed:
                group = 'group-a' if uuid in self.group_a else 'group-b'
                ironic_env.create_nodes(self.client, 1, group, name_prefix=None, uuid=uuid)
                self.sampler.expect_back([uuid])
        self.restore()
        self.wait_settled(60)
        self.baseline = self.stable()
        return self.baseline

    def owners(self, snapshot=None):
        snapshot = self.sampler.fresh_snapshot() if snapshot is None else snapshot
        return snapshot

    def ring_owners(self, hosts):
        """Who the daemons' rules give each group-a node, over ``hosts``.

        The same function as the daemons, over what they list: every
        group-a node in Ironic (no instance is placed at that point).
        """
        # Filtered here too: Ironic's next links drop the conductor_group
        # filter (the daemons' adapter pages by marker for that reason).
        listed = [ownership.NodeInfo(n.uuid) for n in self.client.node.list(
            conductor_group='group-a', fields=['uuid', 'conductor_group'], limit=0)
            if n.conductor_group == 'group-a']
        ring = ownership.node_ring(hash_ring.HashRing(hosts, partition_exponent=12),
                                   listed, [], LOAD_FACTOR)
        return {u: ring.get_hosts(u)[0] for u in self.group_a}

    def shares(self, snapshot, uuids):
        counts = {}
        for uuid in uuids:
            counts[snapshot.get(uuid)] = counts.get(snapshot.get(uuid), 0) + 1
        return counts

    def is_settled(self, snap, expected_a_hosts=A_HOSTS, expected_b_hosts=('compute-4',)):
        """Whether every node is owned by an expected host, each A host owning some."""
        return (all(snap.get(u) in expected_a_hosts for u in self.group_a)
                and all(snap.get(u) in expected_b_hosts for u in self.group_b)
                and set(self.shares(snap, self.group_a)) == set(expected_a_hosts))

    def settled(self, **expected_hosts):
        """The ownership when every node is owned by an expected host."""
        self.check_daemons()
        snap = self.sampler.fresh_snapshot()
        return snap if self.is_settled(snap, **expected_hosts) else None

    def wait_settled(self, timeout, **kwargs):
        """Wait until every node is on an expected host; return that ownership.

        Returns as soon as that is true (the deadline is what the tests
        measure); ``stable()`` then tells whether it moves on.
        """
        return daemons.wait_until(lambda: self.settled(**kwargs), timeout,
                                  message=f'ownership settled on {kwargs or A_HOSTS}')

    def stable(self, seconds=3 * CYCLE):
        """Wait until nothing changes for ``seconds``; return the ownership."""
        last, since = None, time.monotonic()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            snap = self.sampler.fresh_snapshot()
            if snap != last:
                last, since = snap, time.monotonic()
            elif time.monotonic() - since >= seconds:
                return snap
            time.sleep(0.2)
        raise AssertionError('ownership did not become stable')

    def assert_no_violations(self, when):
        """No sample so far showed a lost row, an unknown owner or a duplicate row."""
        found = self.sampler.violations()
        assert not found, f'{when}: {found}'

    def place_instance(self, host, node):
        """Record an instance of ``host`` on ``node``, in the DB and Ironic."""
        instance = str(uuidlib.uuid4())
        with self.engine.begin() as conn:
            conn.execute(sa.text(
                'INSERT INTO instances (uuid, host, node, deleted, created_at) '
                'VALUES (:uuid, :host, :node, 0, CURRENT_TIMESTAMP)'),
                {'uuid': instance, 'host': host, 'node': node})
        self.client.node.update(node, [{'op': 'add', 'path': '/instance_uuid',
                                        'value': instance}])
        self.placed[instance] = node
        return instance

    def remove_instance(self, instance, node):
        self.client.node.update(node, [{'op': 'remove', 'path': '/instance_uuid'}])
        with self.engine.begin() as conn:
            conn.execute(sa.text('DELETE FROM instances WHERE uuid = :uuid'),
                         {'uuid': instance})
        self.placed.pop(instance, None)

    def live_row(self, uuid):
        table = sa.table('compute_nodes', sa.column('id'), sa.column('uuid'),
                         sa.column('host'), sa.column('deleted'))
        with self.engine.connect() as conn:
            return conn.execute(sa.select(table.c.id, table.c.host, table.c.deleted)
                                .where(table.c.uuid == uuid)).all()

    def close(self):
        super().close(self.db_proxy, self.ironic_proxy, self.notify)


started_cluster = daemons.started_on_each_backend(Cluster)



class TestCluster:
    def test_all_start_and_share_the_partition(self, cluster):
        snap = cluster.baseline
        assert cluster.settled() == snap
        # Every node is owned by the one live service the ring picks.
        assert {u: snap[u] for u in cluster.group_a} == cluster.ring_owners(A_HOSTS)
        # Host names compare without case: "Compute-1" owns as compute-1.
        shares = cluster.shares(snap, cluster.group_a)
        assert set(shares) == set(A_HOSTS), shares
        # Spread close to evenly. The ring puts each node on a host
        # independently with probability ~1/3 (its bucket shares for these
        # three names are 0.332-0.335), so a host's count is ~Binomial(n, 1/3),
        # whose standard deviation sqrt(mean * 2/3) is below sqrt(mean):
        # mean + 4 * sqrt(mean) is 4.9 standard deviations above the mean, and
        # the exact binomial tail gives a false failure in about 3 runs in a
        # million. With 120 nodes the bound is 65 of 120, 1.63 x the mean: a
        # host holding twice its share (2/3 of the nodes, 80 +/- 5) fails it in
        # 99.7 % of runs. With the 24 nodes this suite had, the bound was 19 of
        # 24 and such a host passed in 94 % of runs.
        mean = len(cluster.group_a) / len(A_HOSTS)
        assert max(shares.values()) <= mean + 4 * math.sqrt(mean), shares
        print(f'group A spread over {len(A_HOSTS)} hosts: {shares}, '
              f'max/mean {max(shares.values()) / mean:.2f}, '
              f'allowed {1 + 4 / math.sqrt(mean):.2f}')
        cluster.assert_no_violations('all services started')

    def test_ready_and_watchdog_reach_systemd(self, cluster):
        daemons.wait_until(lambda: 'WATCHDOG=1' in cluster.notify.drain(), 10,
                           message='WATCHDOG=1')
        messages = cluster.notify.drain()
        assert messages[0] == 'READY=1'
        assert messages.count('READY=1') == 1

    def test_kill9_fails_over_and_restart_rebalances(self, cluster):
        victim = cluster.daemons['compute-2']
        survivors = ('compute-1', 'compute-3')
        # Taken before the signal: the victim heartbeats no more after it.
        killed_at = time.monotonic()
        victim.kill()
        cluster.wait_settled(KILL_FAILOVER_WAIT, expected_a_hosts=survivors)
        after_failover = cluster.stable()
        cluster.assert_no_violations('after kill -9')
        # The victim's nodes moved, and with bounded loads the survivors'
        # overflow may be placed anew (doc/ring-benchmark.md): every node is
        # where the rules over the survivors put it.
        expected = cluster.ring_owners(survivors)
        wrong = {u: (cluster.baseline[u], after_failover.get(u), host)
                 for u, host in expected.items() if after_failover.get(u) != host}
        assert not wrong, f'(baseline, now, expected) of {len(wrong)} nodes: {wrong}'
        cross = sum(1 for u in cluster.group_a
                    if cluster.baseline[u] != 'compute-2' and expected[u] != cluster.baseline[u])
        print(f'kill -9: {cross} nodes moved between survivors (bounded loads)')
        # Only the overflow of the 3-service bound returns home: 0 at the
        # median and at most 6 in 400 simulated node sets of this size.
        assert cross <= 0.3 * len(cluster.group_a) / len(A_HOSTS)

        # The failover time: from the kill to the first sample that shows
        # every node on a survivor. The bound, from the kill:
        # - the victim's last heartbeat came before the kill, so the survivors
        #   see it down at most SERVICE_DOWN_TIME after the kill. The heartbeat
        #   phase (up to REPORT_INTERVAL) only makes that earlier, so it is no
        #   slack; nor is MariaDB's DATETIME, which truncates to the second;
        # - a survivor sleeps CYCLE after each cycle. Its cycle running when
        #   the victim goes down may have read the services just before; the
        #   next one starts at most one run time + CYCLE later, sees the victim
        #   down and has taken the survivor's share when it ends: at most
        #   CYCLE + 2 run times after the victim is down. That is within the
        #   issue's 2 intervals while a cycle runs in at most CYCLE / 2. On a
        #   machine so loaded that cycles took longer, the excess is added,
        #   from the cycle times the survivors recorded in their services rows
        #   (the cycle that took the last nodes records its time just after
        #   its writes, hence the window up to CYCLE past the failover);
        # - the sampler dates the failover to one sampling period: the gap
        #   between the first sample that shows it and the one before.
        settled_at, sample_before = cluster.sampler.first_sample(
            lambda snap: cluster.is_settled(snap, expected_a_hosts=survivors),
            since=killed_at)
        failover = settled_at - killed_at
        cycle_runs = cluster.sampler.cycle_seconds(survivors, killed_at, settled_at + CYCLE)
        slow_cycle_slack = max(0.0, 2 * max(cycle_runs, default=0.0) - CYCLE)
        sample_period = settled_at - sample_before
        allowed = KILL_FAILOVER_BOUND + slow_cycle_slack + sample_period
        print(f'kill -9 failover {failover:.2f} s, allowed {allowed:.2f} s '
              f'(bound {KILL_FAILOVER_BOUND}, slow cycles {slow_cycle_slack:.2f}, '
              f'sampling {sample_period:.2f}; slowest survivor cycle '
              f'{max(cycle_runs, default=0.0):.2f} s)')
        assert failover <= allowed, (
            f'failover took {failover:.2f} s, more than service_down_time '
            f'{SERVICE_DOWN_TIME} + 2 x {CYCLE} s + {slow_cycle_slack:.2f} s for slow '
            f'cycles + {sample_period:.2f} s sampling; survivor cycles: {cycle_runs}')

        victim.start()
        cluster.wait_settled(30)
        restored = cluster.stable()
        # The same peers give the same ring: it takes back exactly its share,
        # and the others released exactly those nodes.
        assert restored == cluster.baseline
        cluster.assert_no_violations('after the victim restarted and took its share back')

    def test_sigterm_moves_nodes_at_the_next_cycle(self, cluster):
        victim = cluster.daemons['compute-3']
        victim.signal(signal.SIGTERM)
        started = time.monotonic()
        assert victim.process.wait(25) == 0
        cluster.wait_settled(STOP_FAILOVER + 3,
                             expected_a_hosts=('compute-1', 'compute-2'))
        # Well before SERVICE_DOWN_TIME would have let the peers see it down.
        assert time.monotonic() - started < SERVICE_DOWN_TIME
        assert 'Service compute-3 stopped' in victim.log()
        cluster.assert_no_violations('after SIGTERM')
        victim.start()
        cluster.wait_settled(30)
        assert cluster.stable() == cluster.baseline
        cluster.assert_no_violations('after the restart that followed SIGTERM')

    def test_instance_node_stays_with_its_host(self, cluster):
        node = next(u for u in cluster.group_a if cluster.baseline[u] == 'compute-2')
        instance = cluster.place_instance('compute-1', node)
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(node) == 'compute-1',
                           10, message='instance node moving to compute-1')
        # The ring moves (compute-2 stops), the node stays with compute-1.
        cluster.daemons['compute-2'].signal(signal.SIGTERM)
        cluster.daemons['compute-2'].process.wait(25)
        cluster.wait_settled(STOP_FAILOVER + 3, expected_a_hosts=('compute-1', 'compute-3'))
        assert cluster.stable()[node] == 'compute-1'
        cluster.daemons['compute-2'].start()
        cluster.wait_settled(30)
        assert cluster.stable()[node] == 'compute-1'
        # Clean up: without its instance the node goes back to the ring's choice.
        cluster.remove_instance(instance, node)
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(node) == 'compute-2',
                           10, message='node back to compute-2')
        assert cluster.stable() == cluster.baseline
        cluster.assert_no_violations('after the rebalance around an instance')

    def test_sighup_applies_partition_key_and_peer_list(self, cluster):
        daemon = cluster.daemons['compute-3']
        pid = daemon.process.pid
        daemon.options['ironic'].update(partition_key='group-b',
                                        peer_list='compute-3,compute-4')
        daemon.write_config()
        daemon.signal(signal.SIGHUP)
        cluster.wait_settled(10, expected_a_hosts=('compute-1', 'compute-2'),
                             expected_b_hosts=('compute-3', 'compute-4'))
        moved = cluster.stable()
        assert set(cluster.shares(moved, cluster.group_b)) == {'compute-3', 'compute-4'}
        assert set(cluster.shares(moved, cluster.group_a)) == {'compute-1', 'compute-2'}
        assert daemon.alive and daemon.process.pid == pid
        cluster.assert_no_violations('after the rebalance to group-b')

        def refused(text, error):
            # Logged, and the old values stay in force.
            daemon.write_config(text)
            daemon.signal(signal.SIGHUP)
            daemons.wait_until(lambda: error in daemon.log(), 10,
                               message=f'"{error}" in the log')
            time.sleep(3 * CYCLE)
            assert daemon.alive and cluster.stable() == moved

        refused('[ironic\npartition_key = group-a\n', 'Configuration files not reloaded')
        daemon.options['ironic']['partition_key'] = 'not a group!'
        refused(None, 'New configuration not applied')

        daemon.options['ironic']['partition_key'] = 'group-a'
        del daemon.options['ironic']['peer_list']
        daemon.write_config()
        daemon.signal(signal.SIGHUP)
        cluster.wait_settled(10)
        assert cluster.stable() == cluster.baseline
        assert daemon.process.pid == pid
        cluster.assert_no_violations('after the rebalance back to group-a')

    def test_conductor_group_change_moves_the_node(self, cluster):
        free = next(u for u in cluster.group_a if cluster.baseline[u] == 'compute-2')
        pinned = next(u for u in cluster.group_a if cluster.baseline[u] == 'compute-1')
        instance = cluster.place_instance('compute-1', pinned)
        for uuid in (free, pinned):
            cluster.client.node.update(uuid, [{'op': 'replace', 'path': '/conductor_group',
                                               'value': 'group-b'}])
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(free) == 'compute-4',
                           10, message='the node moving to group-b')
        time.sleep(3 * CYCLE)
        assert cluster.stable()[pinned] == 'compute-1'
        for uuid in (free, pinned):
            cluster.client.node.update(uuid, [{'op': 'replace', 'path': '/conductor_group',
                                               'value': 'group-a'}])
        cluster.remove_instance(instance, pinned)
        daemons.wait_until(lambda: cluster.settled() == cluster.baseline
                           or cluster.settled(), 15, message='back in group-a')
        daemons.wait_until(lambda: cluster.stable() == cluster.baseline, 20,
                           message='baseline ownership')
        cluster.assert_no_violations('after the conductor group changes')

    def test_deleted_node_row_is_soft_deleted_and_comes_back(self, cluster):
        uuid = cluster.group_a[0]
        (row_id, host, _), = cluster.live_row(uuid)
        # The one row this suite means to lose: the node is gone from Ironic.
        cluster.sampler.expect_gone([uuid])
        cluster.client.node.delete(uuid)
        daemons.wait_until(lambda: uuid not in cluster.sampler.snapshot(), 10,
                           message='the row soft-deleted')
        assert cluster.live_row(uuid) == [(row_id, host, row_id)]
        ironic_env.create_nodes(cluster.client, 1, 'group-a', name_prefix=None, uuid=uuid)
        cluster.sampler.expect_back([uuid])
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(uuid) == host, 10,
                           message='the row back')
        assert cluster.live_row(uuid) == [(row_id, host, 0)]  # same row, no duplicate
        cluster.assert_no_violations('after a node was deleted and created again')

    def test_ironic_unreachable_changes_no_row(self, cluster):
        before = cluster.stable()
        cluster.ironic_proxy.down()
        try:
            deadline = time.monotonic() + 4 * CYCLE
            while time.monotonic() < deadline:
                assert cluster.sampler.fresh_snapshot() == before
            assert all(d.alive for d in cluster.daemons.values())
            assert 'Cycle skipped, no compute node changed' in \
                cluster.daemons['compute-1'].log()
        finally:
            cluster.ironic_proxy.up()
        new = ironic_env.create_nodes(cluster.client, 1, 'group-a', name_prefix=None)[0]
        cluster.group_a.append(new)
        cluster.nodes.append(new)
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(new) in A_HOSTS, 15,
                           message='a new node recorded after Ironic came back')
        cluster.assert_no_violations('after the Ironic outage')

    def test_database_unreachable_services_survive(self, cluster):
        cluster.db_proxy.down()
        time.sleep(4)
        cluster.db_proxy.up()
        assert all(d.alive for d in cluster.daemons.values())
        new = ironic_env.create_nodes(cluster.client, 1, 'group-a', name_prefix=None)[0]
        cluster.group_a.append(new)
        cluster.nodes.append(new)
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(new) in A_HOSTS, 20,
                           message='a new node recorded after the database came back')
        cluster.wait_settled(20)
        cluster.assert_no_violations('after the database outage')
