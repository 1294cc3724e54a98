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

"""SIGTERM is bounded: a real daemon leaves within graceful_shutdown_timeout.

One ironic-compute process reaches the real Ironic and the database through
TCP proxies that can go silent: they accept connections and never answer,
as a hung server or a black-holed route does. The daemon is stopped while
a build waits on such an Ironic (each request may take [ironic]timeout,
longer than graceful_shutdown_timeout), then while the database is silent.
Both times it must exit within graceful_shutdown_timeout (plus the time a
process takes to exit), and, when the database answers, with its services
row marked stopped. The build it left is then resumed by the restarted
daemon with the allocation it had made: no second reservation. The tests
of the class share one daemon; each first puts it in the state it needs
(running, stopped, or stopped with a build left), so any one runs alone.
"""

import json
import signal
import subprocess
import threading
import time
import uuid as uuidlib

import pytest
import sqlalchemy as sa

from tests.functional import daemons
from tests.functional import ironic_env

pytestmark = pytest.mark.functional

HOST = 'compute-stop'
GROUP = 'group-b'
NODES = 2
GRACEFUL = 10  # graceful_shutdown_timeout
# Longer than GRACEFUL: a request under way at the stop cannot end in time,
# so the daemon must leave it.
IRONIC_TIMEOUT = 30
# Exiting: the interpreter's own shutdown, on a loaded 2-core machine.
SLACK = 3
SETTLE = 60

_services = sa.table('services', sa.column('host'), sa.column('stopped_at'),
                     sa.column('deleted'))
_nodes = sa.table('compute_nodes', sa.column('uuid'), sa.column('host'),
                  sa.column('deleted'))
_instances = sa.table('instances', sa.column('uuid'), sa.column('node'),
                      sa.column('vm_state'), sa.column('task_state'),
                      sa.column('deleted'))


class SilentProxy(daemons.TcpProxy):
    """A TcpProxy that can go silent: it cuts the open connections, then
    accepts new ones and never answers them (nor closes them)."""

    def __init__(self, target_host, target_port):
        super().__init__(target_host, target_port)
        self.silent = threading.Event()
        self._held = []

    def refuse(self, client):
        if self.silent.is_set():  # held open, never answered
            self._held.append(client)
            return True
        return False

    def silence(self):
        self.silent.set()
        self.down()

    def speak(self):
        self.silent.clear()
        held, self._held = self._held, []
        for sock in held:
            sock.close()
        self.up()

    def close(self):
        self.speak()
        super().close()


class StopSetup(daemons.BackendFleet):
    """One daemon, NODES buildable nodes, silent-capable proxies, the CLI."""

    def __init__(self, backend, workdir, ironic):
        super().__init__(backend, workdir, ironic,
                         manage_options={'service_down_time': 6, 'report_interval': 1})
        self.db_proxy = SilentProxy.to(self.database.url)
        self.ironic_proxy = SilentProxy.to(ironic.url)
        self.nodes = ironic_env.create_nodes(
            self.client, NODES, GROUP, name_prefix=f'stop-{uuidlib.uuid4().hex[:6]}')
        ironic_env.make_buildable(self.client, self.nodes)
        self.interrupted = None  # the build a stop left, if any
        self.daemon = self.add(HOST, {
            'DEFAULT': {
                'host': HOST, 'report_interval': 1, 'service_down_time': 6,
                'update_resources_interval': 2, 'instance_poll_interval': 0.5,
                'graceful_shutdown_timeout': GRACEFUL, 'state_path': workdir,
            },
            'database': {
                'connection': self.db_proxy.reach(self.database.url),
                'max_retries': 3, 'retry_interval': 1},
            'ironic': {
                'auth_type': 'none',
                'endpoint_override': self.ironic_proxy.reach(ironic.url),
                'partition_key': GROUP, 'api_max_retries': 3,
                'api_retry_interval': 2, 'timeout': IRONIC_TIMEOUT,
                'deploy_timeout': 60,
            },
        })

    def start(self):
        super().start()
        self.wait_ready()

    def running(self):
        """The daemon running with its rows, both proxies speaking."""
        self.ironic_proxy.speak()
        self.db_proxy.speak()
        if not self.daemon.alive:
            self.daemon.start()
        self.wait_ready()

    def stopped(self):
        """The daemon stopped, both proxies speaking."""
        self.ironic_proxy.speak()
        self.db_proxy.speak()
        if self.daemon.alive:
            self.sigterm()

    def interrupt_a_build(self):
        """Stop the daemon while a build waits on a silent Ironic; the
        seconds the stop took. The build is left in ``interrupted``."""
        self.running()
        self.ironic_proxy.silence()
        created = self.manage('instance', 'create', '--name', 'stop-1',
                              '--resource-class', ironic_env.DEFAULT_RESOURCE_CLASS,
                              '--format', 'json')
        assert created.returncode == 0, created.stderr
        uuid = json.loads(created.stdout)['uuid']
        # The worker claims the build (a database write), then waits on Ironic.
        daemons.wait_until(lambda: self.instance(uuid).task_state == 'spawning',
                           SETTLE, message='the build under way')
        time.sleep(1)
        seconds = self.sigterm()
        self.interrupted = uuid
        return seconds

    def wait_ready(self):
        """The daemon's rows for our nodes exist: it can be given a build."""
        daemons.wait_until(self.service_running, SETTLE, message='the service up')
        daemons.wait_until(
            lambda: self.held_nodes() == NODES, SETTLE, message='rows for the nodes')

    def manage(self, *args):
        return super().manage(*args, timeout=60)

    def service_running(self):
        self.daemon.check()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(_services.c.stopped_at).where(
                _services.c.host == HOST, _services.c.deleted == 0)).first()
        return row is not None and row.stopped_at is None

    def stopped_at(self):
        with self.engine.connect() as conn:
            return conn.execute(sa.select(_services.c.stopped_at).where(
                _services.c.host == HOST, _services.c.deleted == 0)).scalar()

    def held_nodes(self):
        """How many of our nodes have a live row of this daemon."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).where(
                _nodes.c.uuid.in_(self.nodes), _nodes.c.host == HOST,
                _nodes.c.deleted == 0)).scalar()

    def instance(self, uuid):
        with self.engine.connect() as conn:
            return conn.execute(sa.select(_instances).where(
                _instances.c.uuid == uuid, _instances.c.deleted == 0)).first()

    def sigterm(self):
        """SIGTERM the daemon; the seconds it took to exit (or fail)."""
        start = time.monotonic()
        self.daemon.signal(signal.SIGTERM)
        try:
            self.daemon.process.wait(GRACEFUL + SLACK)
        except subprocess.TimeoutExpired:
            # Past the bound: a Guru Meditation Report puts every thread's
            # stack in the log, to say where it hangs.
            self.daemon.process.send_signal(signal.SIGUSR2)
        try:
            self.daemon.process.wait(30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            raise AssertionError(f'still running {GRACEFUL + 30} s after SIGTERM:\n'
                                 f'{self.daemon.log()[-3000:]}') from None
        return time.monotonic() - start

    def close(self):
        super().close(self.db_proxy, self.ironic_proxy)


@pytest.fixture(scope='class', params=['mysql', 'postgresql'])
def setup(request, ironic_server, tmp_path_factory):
    with daemons.running(StopSetup, request.param, ironic_server,
                         tmp_path_factory) as setup:
        yield setup


class TestStop:
    def test_a_build_waiting_on_a_silent_ironic_does_not_hold_the_stop(self, setup):
        seconds = setup.interrupt_a_build()
        log = setup.daemon.log()
        assert seconds < GRACEFUL + SLACK, log[-3000:]
        assert setup.daemon.process.returncode == 0, log[-3000:]
        assert setup.stopped_at() is not None
        assert 'Leaving with work still running' in log
        assert 'Traceback' not in log

    def test_the_restarted_daemon_resumes_the_build_with_one_reservation(self, setup):
        if setup.interrupted is None or setup.daemon.alive:
            setup.interrupt_a_build()
        uuid, setup.interrupted = setup.interrupted, None
        setup.ironic_proxy.speak()
        setup.daemon.start()

        def finished():
            row = setup.instance(uuid)
            return row if row.task_state is None else None

        row = daemons.wait_until(finished, SETTLE, message='the build resumed and finished')
        assert row.vm_state == 'active', row
        mine = [a for a in ironic_env.list_allocations(setup.client)
                if a['name'] == uuid]
        assert [a['node_uuid'] for a in mine] == [row.node]

    def test_a_silent_database_does_not_hold_the_stop(self, setup):
        setup.running()
        setup.db_proxy.silence()
        time.sleep(2)  # the heartbeat and the poller now wait on it
        seconds = setup.sigterm()
        log = setup.daemon.log()
        assert seconds < GRACEFUL + SLACK, log[-3000:]
        assert 'Could not mark the service stopped' in log
        setup.db_proxy.speak()

    def test_a_stop_with_nothing_stuck_is_quick_and_clean(self, setup):
        setup.stopped()
        before = len(setup.daemon.log())
        setup.daemon.start()
        daemons.wait_until(lambda: 'INFO ironic_compute.nodes.tracker [-] Cycle:'
                           in setup.daemon.log()[before:], SETTLE,
                           message='a first cycle')
        time.sleep(2)  # heartbeats, the poller, another cycle
        seconds = setup.sigterm()
        log = setup.daemon.log()[before:]
        assert setup.daemon.process.returncode == 0, log[-3000:]
        assert seconds < 5, log[-3000:]
        assert setup.stopped_at() is not None
        assert 'Leaving with work still running' not in log
        assert 'did not finish' not in log
