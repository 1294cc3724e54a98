"""Several real ironic-compute processes on MariaDB and PostgreSQL.

Four daemons share a real Ironic: three manage conductor group "group-a",
one manages "group-b". A sampler reads compute_nodes continuously; the
tests kill, stop, restart and reconfigure daemons, change nodes in Ironic,
and cut the database and Ironic off through TCP proxies, checking after
each step who owns what and that no node was ever owned twice or lost.
The tests of a class run in order on one cluster and leave it as they
found it.
"""

import os
import signal
import socket
import time
import uuid as uuidlib

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ironic_compute import hash_ring
from tests import db_fixtures
from tests.functional import daemons
from tests.functional import ironic_env

REPORT_INTERVAL = 1
SERVICE_DOWN_TIME = 8
CYCLE = 1
# Failover of a killed service: it is seen down after SERVICE_DOWN_TIME,
# then the survivors need up to two cycles; the rest is process slack.
KILL_FAILOVER = SERVICE_DOWN_TIME + 2 * CYCLE + 4
# A service that stopped cleanly is gone at the survivors' next cycle.
STOP_FAILOVER = 2 * CYCLE + 2
GROUP_A_NODES = 24
GROUP_B_NODES = 9
A_HOSTS = ('compute-1', 'compute-2', 'compute-3')


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


class Cluster:
    def __init__(self, backend, workdir, ironic, client):
        self.backend = backend
        self.workdir = workdir
        self.ironic = ironic
        self.client = client
        self.prefix = f'fn-{backend}-{uuidlib.uuid4().hex[:6]}'
        self.database = db_fixtures.ProvisionedDatabase(backend)
        url = make_url(self.database.url)
        self.db_proxy = daemons.TcpProxy(url.host, url.port)
        self.db_proxy.start()
        self.daemon_db_url = url.set(port=self.db_proxy.port).render_as_string(
            hide_password=False)
        ironic_url = make_url(ironic.url.replace('http://', 'mysql://'))  # host/port parse
        self.ironic_proxy = daemons.TcpProxy(ironic_url.host, ironic_url.port)
        self.ironic_proxy.start()
        self.engine = sa.create_engine(self.database.url, poolclass=sa.pool.NullPool)
        self.group_a = ironic_env.create_nodes(client, GROUP_A_NODES, 'group-a',
                                               name_prefix=self.prefix + '-a')
        self.group_b = ironic_env.create_nodes(client, GROUP_B_NODES, 'group-b',
                                               name_prefix=self.prefix + '-b')
        self.daemons = {}
        for name in ('Compute-1', 'compute-2', 'compute-3'):
            self.daemons[name.lower()] = self._daemon(name, 'group-a')
        self.daemons['compute-4'] = self._daemon('compute-4', 'group-b',
                                                 peer_list='compute-3,compute-4')
        self.notify = NotifySocket(os.path.join(workdir, 'notify.sock'))
        self.daemons['compute-1'].env = {'NOTIFY_SOCKET': self.notify.path,
                                         'WATCHDOG_USEC': '30000000'}
        self.sampler = daemons.OwnershipSampler(self.database.url)

    def _daemon(self, host, group, peer_list=None):
        ironic_opts = {
            'auth_type': 'none',
            'endpoint_override': f'http://127.0.0.1:{self.ironic_proxy.port}',
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
            'hash_ring': {'partition_exponent': 12},
        }
        return daemons.Daemon(host, self.workdir, options)

    def start(self):
        sync = self.manage('db', 'sync')
        assert sync.returncode == 0, sync.stderr
        for daemon in self.daemons.values():
            daemon.start()
        self.sampler.start()

    def manage(self, *args):
        import subprocess
        import sys
        config = os.path.join(self.workdir, 'manage.conf')
        with open(config, 'w') as f:
            f.write(f'[database]\nconnection = {self.database.url}\n')
        return subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), 'ironic-compute-manage'),
             '--config-file', config, *args], capture_output=True, text=True, timeout=60)

    def owners(self, snapshot=None):
        snapshot = self.sampler.fresh_snapshot() if snapshot is None else snapshot
        return snapshot

    def shares(self, snapshot, uuids):
        counts = {}
        for uuid in uuids:
            counts[snapshot.get(uuid)] = counts.get(snapshot.get(uuid), 0) + 1
        return counts

    def settled(self, expected_a_hosts=A_HOSTS, expected_b_hosts=('compute-4',)):
        """The ownership when every node is owned by an expected host."""
        for daemon in self.daemons.values():
            daemon.check()
        snap = self.sampler.fresh_snapshot()
        if not all(snap.get(u) in expected_a_hosts for u in self.group_a):
            return None
        if not all(snap.get(u) in expected_b_hosts for u in self.group_b):
            return None
        if set(self.shares(snap, self.group_a)) != set(expected_a_hosts):
            return None
        return snap

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
        return instance

    def remove_instance(self, instance, node):
        self.client.node.update(node, [{'op': 'remove', 'path': '/instance_uuid'}])
        with self.engine.begin() as conn:
            conn.execute(sa.text('DELETE FROM instances WHERE uuid = :uuid'),
                         {'uuid': instance})

    def live_row(self, uuid):
        table = sa.table('compute_nodes', sa.column('id'), sa.column('uuid'),
                         sa.column('host'), sa.column('deleted'))
        with self.engine.connect() as conn:
            return conn.execute(sa.select(table.c.id, table.c.host, table.c.deleted)
                                .where(table.c.uuid == uuid)).all()

    def close(self):
        for daemon in self.daemons.values():
            daemon.stop()
        self.sampler.close()
        self.db_proxy.close()
        self.ironic_proxy.close()
        self.notify.close()
        ironic_env.delete_nodes(self.client, self.group_a + self.group_b)
        self.engine.dispose()
        self.database.drop()


@pytest.fixture(scope='class', params=['mysql', 'postgresql'])
def cluster(request, ironic_server, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp(f'cluster-{request.param}'))
    cluster = Cluster(request.param, workdir, ironic_server, ironic_server.client())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        for name, daemon in cluster.daemons.items():
            # Keep what the daemons said next to the test report on failure.
            print(f'---- {name} log (last 3000 chars) ----\n{daemon.log()[-3000:]}')


class TestCluster:
    def test_01_all_start_and_share_the_partition(self, cluster):
        cluster.wait_settled(60)
        snap = cluster.stable()
        assert cluster.settled() == snap
        shares = cluster.shares(snap, cluster.group_a)
        # Exactly the ring's assignment (whose balance tools/bench_ring.py
        # measures): 24 random uuids are too few to judge evenness by.
        ring = hash_ring.HashRing(A_HOSTS, partition_exponent=12)
        assert {u: snap[u] for u in cluster.group_a} == {
            u: ring.get_hosts(u)[0] for u in cluster.group_a}
        assert all(n >= 1 for n in shares.values()), shares
        # Host names compare without case: "Compute-1" owns as compute-1.
        assert 'compute-1' in shares
        cluster.baseline = cluster.stable()
        assert not cluster.sampler.duplicates

    def test_02_ready_and_watchdog_reach_systemd(self, cluster):
        daemons.wait_until(lambda: 'WATCHDOG=1' in cluster.notify.drain(), 10,
                           message='WATCHDOG=1')
        messages = cluster.notify.drain()
        assert messages[0] == 'READY=1'
        assert messages.count('READY=1') == 1

    def test_03_kill9_fails_over_and_restart_rebalances(self, cluster):
        victim = cluster.daemons['compute-2']
        victim.kill()
        started = time.monotonic()
        cluster.wait_settled(KILL_FAILOVER, expected_a_hosts=('compute-1', 'compute-3'))
        elapsed = time.monotonic() - started
        assert elapsed <= KILL_FAILOVER
        after_failover = cluster.stable()
        # Only the victim's nodes moved.
        for uuid, host in cluster.baseline.items():
            if host != 'compute-2':
                assert after_failover[uuid] == host
        victim.start()
        cluster.wait_settled(30)
        restored = cluster.stable()
        # The same peers give the same ring: it takes back exactly its share,
        # and the others released exactly those nodes.
        assert restored == cluster.baseline
        assert not cluster.sampler.duplicates

    def test_04_sigterm_moves_nodes_at_the_next_cycle(self, cluster):
        victim = cluster.daemons['compute-3']
        victim.signal(signal.SIGTERM)
        started = time.monotonic()
        assert victim.process.wait(25) == 0
        cluster.wait_settled(STOP_FAILOVER + 3,
                             expected_a_hosts=('compute-1', 'compute-2'))
        # Well before SERVICE_DOWN_TIME would have let the peers see it down.
        assert time.monotonic() - started < SERVICE_DOWN_TIME
        assert 'Service compute-3 stopped' in victim.log()
        victim.start()
        cluster.wait_settled(30)
        assert cluster.stable() == cluster.baseline

    def test_05_instance_node_stays_with_its_host(self, cluster):
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

    def test_06_sighup_applies_partition_key_and_peer_list(self, cluster):
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

    def test_07_conductor_group_change_moves_the_node(self, cluster):
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

    def test_08_deleted_node_row_is_soft_deleted_and_comes_back(self, cluster):
        uuid = cluster.group_a[0]
        (row_id, host, _), = cluster.live_row(uuid)
        cluster.client.node.delete(uuid)
        daemons.wait_until(lambda: uuid not in cluster.sampler.snapshot(), 10,
                           message='the row soft-deleted')
        assert cluster.live_row(uuid) == [(row_id, host, row_id)]
        ironic_env.create_nodes(cluster.client, 1, 'group-a', name_prefix=None, uuid=uuid)
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(uuid) == host, 10,
                           message='the row back')
        assert cluster.live_row(uuid) == [(row_id, host, 0)]  # same row, no duplicate

    def test_09_ironic_unreachable_changes_no_row(self, cluster):
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
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(new) in A_HOSTS, 15,
                           message='a new node recorded after Ironic came back')

    def test_10_database_unreachable_services_survive(self, cluster):
        cluster.db_proxy.down()
        time.sleep(4)
        cluster.db_proxy.up()
        assert all(d.alive for d in cluster.daemons.values())
        new = ironic_env.create_nodes(cluster.client, 1, 'group-a', name_prefix=None)[0]
        cluster.group_a.append(new)
        daemons.wait_until(lambda: cluster.sampler.snapshot().get(new) in A_HOSTS, 20,
                           message='a new node recorded after the database came back')
        cluster.wait_settled(20)
        assert not cluster.sampler.duplicates
