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

"""The watchdog watches the daemon's loops, not Ironic or the database."""

import logging
import os
import socket
import threading
import time

import pytest
from oslo_config import cfg

from ironic_compute import conf as ic_conf
from ironic_compute import ironic  # noqa: F401 - installs the log filter
from ironic_compute.daemon import service
from ironic_compute.daemon import systemd
from ironic_compute.daemon import watchdog
from ironic_compute.db import services as db_services
from ironic_compute.nodes import tracker as resource_tracker
from tests import hooks
from tests.unit import fakes


def test_loops_healthy_while_threads_live_and_calls_return():
    loops = watchdog.Loops(stuck_after=5)
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        loops.watch('resource-tracker', thread)
        assert loops.problem() is None
        with loops.turn('resource-tracker'):
            began = time.monotonic()
            assert loops.problem(now=began + 4) is None
            assert 'stuck' in loops.problem(now=began + 6)
        assert loops.problem(now=time.monotonic() + 100) is None
    finally:
        done.set()
        thread.join()
    assert 'has ended' in loops.problem()


def test_ironicclient_attempt_errors_are_demoted(caplog):
    caplog.set_level(logging.INFO)
    log = logging.getLogger('ironicclient.common.http')
    log.error('Error contacting Ironic server: refused. Attempt 1 of 1')
    log.error('something else')
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ('ERROR', 'something else') in messages
    assert not any('Error contacting' in m for _, m in messages)


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / 'notify.sock')
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    yield path, sock
    sock.close()


def received(sock, seconds, enough=None):
    """The messages that arrive within ``seconds`` (older ones dropped);
    sooner once ``enough(messages)`` holds."""
    sock.setblocking(False)
    try:
        while True:
            sock.recv(64)
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(0.1)
    messages, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            messages.append(sock.recv(64).decode())
        except TimeoutError:
            pass
        if enough is not None and enough(messages):
            break
    return messages


def pinged(messages):
    return 'WATCHDOG=1' in messages


@pytest.fixture
def svc(sqlite_engine, tmp_path, notify_socket, monkeypatch):
    path, _ = notify_socket
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    config = tmp_path / 'ic.conf'
    config.write_text('[DEFAULT]\nhost = compute-a\nreport_interval = 1\n'
                      'service_down_time = 10\nupdate_resources_interval = 1\n'
                      'loop_stuck_timeout = 1\n')
    conf(['--config-file', str(config)], project='ironic-compute')
    hang = tmp_path / 'hang'
    tracker = resource_tracker.ResourceTracker
    monkeypatch.setattr(tracker, 'run_cycle',
                        hooks.hang_while(str(hang), tracker.run_cycle))
    notifier = systemd.Notifier({'NOTIFY_SOCKET': path,
                                 'WATCHDOG_USEC': '600000'})
    fake = fakes.FakeIronic(fakes.make_node() for _ in range(3))
    svc = service.ComputeService(conf, ironic_client=fake, notifier=notifier)
    svc.fake, svc.hang = fake, hang
    yield svc
    if hang.exists():
        os.unlink(hang)
    svc.stop()


def test_pings_go_on_through_outages_and_stop_on_a_hang(svc, notify_socket,
                                                        monkeypatch):
    _, sock = notify_socket
    svc.start()
    assert pinged(received(sock, 1, enough=pinged))

    # Ironic and the database both fail: the loops still turn.
    svc.fake.fail = True

    def no_database(*args, **kwargs):
        raise service.db_exc.DBConnectionError('connection refused')

    monkeypatch.setattr(db_services, 'heartbeat', no_database)
    monkeypatch.setattr(db_services, 'record_cycle', no_database)
    assert received(sock, 2).count('WATCHDOG=1') >= 3

    # The tracker thread hangs at its next cycle: the pings stop once that
    # has not returned for loop_stuck_timeout (1 s), and stay stopped.
    svc.hang.touch()
    deadline = time.monotonic() + 10
    while 'WATCHDOG=1' in received(sock, 0.8):
        assert time.monotonic() < deadline, 'the pings never stopped'
    assert 'WATCHDOG=1' not in received(sock, 1.5)
    os.unlink(svc.hang)
    assert pinged(received(sock, 1.5, enough=pinged))
