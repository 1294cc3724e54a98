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

"""Outages, pauses and skewed clocks with three real daemons.

Three ironic-compute processes share one conductor group of the real Ironic
and reach the database and Ironic through TCP proxies the tests cut. Their
host clocks are shifted by -5, +5 and 0 minutes (a test hook that offsets
the Python clock): liveness must be judged on the database's clock only.
compute-1 runs under a real NOTIFY_SOCKET with a 3 s watchdog. The tests of
the class share one cluster; each starts from the state ``ready`` builds
(and leaves it as it found it), so any one runs alone.
"""

import datetime
import os
import socket
import threading
import time
import uuid as uuidlib

import sqlalchemy as sa

from tests.functional import daemons
from tests.functional import ironic_env

SERVICE_DOWN_TIME = 6
REPORT_INTERVAL = 1
CYCLE = 1
NODES = 40
HOSTS = ('compute-1', 'compute-2', 'compute-3')
CLOCK_SHIFT = {'compute-1': -300, 'compute-2': 300, 'compute-3': 0}
WATCHDOG_SECONDS = 3
STUCK_TIMEOUT = 5  # compute-1's loop_stuck_timeout
# The bound for an outage: at most 2 % of the rows change owner.
MAX_MOVED = 0.02


class NotifyRecorder(threading.Thread):
    """A real NOTIFY_SOCKET; keeps ``(time.monotonic(), message)``."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages = []
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, OSError):
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def pings(self, start, end):
        return [t for t, m in list(self.messages) if m == 'WATCHDOG=1' and start <= t <= end]

    def longest_silence(self, start, end):
        """The longest time without WATCHDOG=1 between ``start`` and ``end``."""
        times = [start, *self.pings(start, end), end]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    def close(self):
        self._halt.set()
        self.join(2)
        self.sock.close()


class ServicesSampler(threading.Thread):
    """Samples owners and services rows together, with the database's time."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.history = []  # (monotonic, db_now, {uuid: host}, {host: (seen, cycle_start)})
        self._halt = threading.Event()
        self._nodes = sa.table('compute_nodes', sa.column('uuid'), sa.column('host'),
                               sa.column('deleted'))
        self._services = sa.table('services', sa.column('host'), sa.column('deleted'),
                                  sa.column('last_seen_up'), sa.column('last_cycle_at'),
                                  sa.column('last_cycle_seconds'))

    def run(self):
        from ironic_compute.db import clock
        while not self._halt.is_set():
            try:
                with self.engine.begin() as conn:
                    now = conn.execute(sa.select(clock.utc_now())).scalar_one()
                    owners = dict(conn.execute(
                        sa.select(self._nodes.c.uuid, self._nodes.c.host)
                        .where(self._nodes.c.deleted == 0)).all())
                    services = {}
                    for host, seen, cycle_at, seconds in conn.execute(sa.select(
                            self._services.c.host, self._services.c.last_seen_up,
                            self._services.c.last_cycle_at,
                            self._services.c.last_cycle_seconds)
                            .where(self._services.c.deleted == 0)):
                        start = None
                        if cycle_at is not None:
                            start = cycle_at - datetime.timedelta(seconds=seconds or 0)
                        services[host] = (seen, start)
            except sa.exc.SQLAlchemyError:
                pass
            else:
                self.history.append((time.monotonic(), now, owners, services))
            self._halt.wait(0.1)

    def db_now(self):
        return self.history[-1][1]

    def since(self, start):
        return [h for h in list(self.history) if h[0] >= start]

    def close(self):
        self._halt.set()
        self.join(5)
        self.engine.dispose()


class Cluster(daemons.BackendFleet):
    def __init__(self, backend, workdir, ironic):
        super().__init__(backend, workdir, ironic, daemons.OwnershipSampler)
        self.db_proxy = daemons.TcpProxy.to(self.database.url)
        db_url = self.db_proxy.reach(self.database.url)
        self.ironic_proxy = daemons.TcpProxy.to(ironic.url)
        self.group = f'rec-{uuidlib.uuid4().hex[:6]}'
        self.nodes = ironic_env.create_nodes(self.client, NODES, 'group-a',
                                             name_prefix=self.group)
        self.hang_file = os.path.join(workdir, 'hang-compute-1')
        self.notify = NotifyRecorder(os.path.join(workdir, 'notify.sock'))
        for host in HOSTS:
            options = {
                'DEFAULT': {
                    'host': host, 'report_interval': REPORT_INTERVAL,
                    'service_down_time': SERVICE_DOWN_TIME,
                    'update_resources_interval': CYCLE,
                    'graceful_shutdown_timeout': 20, 'state_path': workdir,
                    'loop_stuck_timeout': STUCK_TIMEOUT,
                },
                'database': {'connection': db_url, 'max_retries': 3,
                             'retry_interval': 1},
                'ironic': {
                    'auth_type': 'none',
                    'endpoint_override': self.ironic_proxy.reach(ironic.url),
                    'partition_key': 'group-a', 'api_max_retries': 0,
                    'api_retry_interval': 0, 'timeout': 5,
                },
                'hash_ring': {'partition_exponent': 12},
            }
            daemon = self.add(host, options)
            daemon.command = daemons.HOOKED_COMPUTE
            daemon.env = {'IC_TEST_CLOCK_OFFSET': str(CLOCK_SHIFT[host])}
        self.daemons['compute-1'].env.update({
            'NOTIFY_SOCKET': self.notify.path,
            'WATCHDOG_USEC': str(WATCHDOG_SECONDS * 1_000_000),
            'IC_TEST_HANG_FILE': self.hang_file,
        })
        self.services = ServicesSampler(self.database.url)

    def start(self):
        self.notify.start()
        super().start()
        self.services.start()

    def ready(self):
        """What each test starts from: the database and Ironic reachable, no
        hang, the three daemons running unfrozen and ``baseline`` their
        settled ownership."""
        self.db_proxy.up()
        self.ironic_proxy.up()
        if os.path.exists(self.hang_file):
            os.unlink(self.hang_file)
        self.restore()
        self.baseline = self.stable()
        return self.baseline

    def manage(self, *args):
        return super().manage(*args, timeout=60)

    def check_alive(self):
        self.check_daemons()

    def settled(self, hosts=HOSTS):
        self.check_alive()
        snap = self.sampler.fresh_snapshot()
        if all(snap.get(u) in hosts for u in self.nodes) and \
                {snap.get(u) for u in self.nodes} == set(hosts):
            return snap
        return None

    def stable(self, seconds=3 * CYCLE, hosts=HOSTS):
        """Every node on ``hosts`` and nothing changing for ``seconds``."""
        last, since = None, time.monotonic()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            snap = self.settled(hosts)
            if snap != last:
                last, since = snap, time.monotonic()
            elif snap is not None and time.monotonic() - since >= seconds:
                return snap
            time.sleep(0.2)
        raise AssertionError(f'ownership did not settle on {hosts}')

    def moved_since(self, start, baseline):
        """Nodes seen on another owner than ``baseline`` since ``start``."""
        moved = set()
        for read_at, owners in list(self.sampler.history):
            if read_at >= start:
                moved |= {u for u in self.nodes if owners.get(u) != baseline[u]}
        return moved

    def close(self):
        super().close(self.services, self.notify, self.db_proxy, self.ironic_proxy)


started_cluster = daemons.started_on_each_backend(Cluster)



def outage(proxy):
    """Cut ``proxy`` for twice service_down_time; (cut, back): when it went
    down and came back up, on the monotonic clock."""
    cut = time.monotonic()
    proxy.down()
    time.sleep(2 * SERVICE_DOWN_TIME)
    proxy.up()
    return cut, time.monotonic()


def no_traceback(cluster):
    for host, daemon in cluster.daemons.items():
        assert 'Traceback' not in daemon.log(), f'{host} logged a traceback'


class TestRecovery:
    def test_skewed_clocks_neither_look_dead_nor_kill_peers(self, cluster):
        # -5 and +5 minutes: with host clocks, compute-1 would look dead to
        # the others and see compute-2 as dead (its heartbeats "from the
        # future" aside); rows would change owner at every cycle.
        cluster.baseline = cluster.stable(seconds=2 * SERVICE_DOWN_TIME)
        start = time.monotonic()
        time.sleep(SERVICE_DOWN_TIME)
        assert not cluster.moved_since(start, cluster.baseline)
        listing = cluster.manage('service', 'list', '--format', 'json')
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout.count('"state": "up"') == 3, listing.stdout
        assert not cluster.sampler.violations()

    def test_database_outage_moves_no_row(self, cluster):
        cut, back = outage(cluster.db_proxy)
        # The gate stays shut for up to service_down_time after recovery.
        time.sleep(SERVICE_DOWN_TIME + 3 * CYCLE)
        cluster.check_alive()
        assert cluster.stable() == cluster.baseline
        moved = cluster.moved_since(cut, cluster.baseline)
        print(f'database outage of {back - cut:.1f} s: {len(moved)} of '
              f'{len(cluster.nodes)} nodes changed owner')
        assert len(moved) <= MAX_MOVED * len(cluster.nodes), sorted(moved)
        assert not cluster.sampler.violations()
        # The watchdog kept pinging through the outage.
        silence = cluster.notify.longest_silence(cut, back)
        assert silence < WATCHDOG_SECONDS, f'no WATCHDOG=1 for {silence:.1f} s'
        log = cluster.daemons['compute-2'].log()
        assert 'Heartbeat failed: the database is unreachable since' in log
        assert 'The database (heartbeat) reachable again after' in log
        no_traceback(cluster)

    def test_ironic_outage_moves_no_row(self, cluster):
        cut, back = outage(cluster.ironic_proxy)
        time.sleep(3 * CYCLE)
        cluster.check_alive()
        assert not cluster.moved_since(cut, cluster.baseline)
        assert cluster.stable() == cluster.baseline
        assert not cluster.sampler.violations()
        silence = cluster.notify.longest_silence(cut, back)
        assert silence < WATCHDOG_SECONDS, f'no WATCHDOG=1 for {silence:.1f} s'
        log = cluster.daemons['compute-3'].log()
        assert 'Ironic unavailable since' in log
        # One line per cycle from the adapter; ironicclient's own per-attempt
        # ERROR is not in the log.
        assert 'Error contacting Ironic server' not in log
        no_traceback(cluster)

    def test_paused_daemon_rejoins_without_taking_rows_back_early(self, cluster):
        victim = cluster.daemons['compute-2']
        peers = ('compute-1', 'compute-3')
        victim.pause()
        try:
            # The peers judge it dead and take its rows.
            daemons.wait_until(lambda: cluster.settled(peers), SERVICE_DOWN_TIME + 15,
                               message='the peers holding every node')
            time.sleep(2 * CYCLE)
            resumed = time.monotonic()
            paused_at_db = cluster.services.db_now()
        finally:
            victim.resume()
        assert cluster.stable() == cluster.baseline
        history = cluster.services.since(resumed)
        # The victim's first heartbeat after the pause, on the database's clock.
        heartbeat = next(s['compute-2'][0] for _, _, _, s in history
                         if s['compute-2'][0] > paused_at_db)
        first_take = next((owners, services) for _, _, owners, services in history
                          if 'compute-2' in owners.values())
        owners, services = first_take
        for peer in peers:
            started = services[peer][1]
            assert started is not None and started > heartbeat, (
                f'compute-2 took rows before {peer} ran a cycle that saw it up')
        # Each node moved at most back to the victim: no row swung twice.
        for uuid in cluster.nodes:
            seq = [o.get(uuid) for _, _, o, _ in history]
            changes = sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)
            assert changes <= 1, (uuid, seq)
        assert 'rejoins like a new service' in victim.log()
        assert not cluster.sampler.violations()

    def test_a_hung_tracker_stops_the_pings(self, cluster):
        open(cluster.hang_file, 'w').close()
        hung = time.monotonic()
        try:
            daemons.wait_until(
                lambda: 'Watchdog: the resource-tracker loop is stuck'
                in cluster.daemons['compute-1'].log(),
                STUCK_TIMEOUT + CYCLE + 10, message='the watchdog noticing the hang')
            noticed = time.monotonic()
            time.sleep(2 * WATCHDOG_SECONDS)
            assert not cluster.notify.pings(noticed + 0.5, time.monotonic())
            # Before it counted as stuck, the pings went on.
            assert cluster.notify.pings(hung, hung + STUCK_TIMEOUT - 1)
        finally:
            os.unlink(cluster.hang_file)
        daemons.wait_until(lambda: cluster.notify.pings(time.monotonic() - 2, time.monotonic()),
                           10, message='pings again once the cycle returned')
        cluster.check_alive()
