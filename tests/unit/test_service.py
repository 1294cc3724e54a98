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

"""The service in-process: start, cycles, SIGHUP semantics, clean stop."""

import dataclasses
import datetime
import logging as std_logging
import socket
import threading
import time

import pytest
import sqlalchemy as sa
from oslo_config import cfg
from oslo_log import log as oslo_logging

from ironic_compute import conf as ic_conf
from ironic_compute import exception
from ironic_compute.cluster import lease
from ironic_compute.daemon import service
from ironic_compute.daemon import stopping
from ironic_compute.daemon import systemd
from ironic_compute.db import models
from tests.unit import fakes
from tests.unit.db_rows import live_nodes

BASE = """
[DEFAULT]
host = Compute-A
report_interval = 1
service_down_time = 5
update_resources_interval = 1
graceful_shutdown_timeout = 10
[ironic]
partition_key = rack-1
[hash_ring]
partition_exponent = 10
"""


class RecordingNotifier:
    watchdog_enabled = False  # no watchdog thread unless a test asks

    def __init__(self):
        self.messages = []
        self.cycles = threading.Semaphore(0)

    def ready(self):
        self.messages.append('READY=1')

    def watchdog(self):
        self.messages.append('WATCHDOG=1')
        self.cycles.release()

    def stopping(self):
        self.messages.append('STOPPING=1')


@pytest.fixture
def conf(tmp_path):
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    path = tmp_path / 'ironic-compute.conf'
    path.write_text(BASE)
    conf(['--config-file', str(path)], project='ironic-compute')
    conf.path = path
    return conf


@pytest.fixture
def fake():
    return fakes.FakeIronic(fakes.make_node(conductor_group=g)
                            for g in ['rack-1'] * 5 + ['rack-2'] * 3)


@pytest.fixture
def svc(sqlite_engine, conf, fake):
    notifier = RecordingNotifier()
    svc = service.ComputeService(conf, ironic_client=fake, notifier=notifier)
    yield svc
    svc.stop()


def test_schema_check_names_the_command(tmp_path):
    from ironic_compute.db import api as db_api
    manager = db_api.facade().make_new_manager()
    manager.configure(connection=f'sqlite:///{tmp_path}/empty.sqlite')
    reset = db_api.facade().patch_factory(manager)
    try:
        with pytest.raises(exception.SchemaError, match='ironic-compute-manage db sync'):
            service.check_schema()
    finally:
        reset()


def test_start_runs_a_cycle_then_says_ready(svc, sqlite_engine):
    svc.start()
    assert svc.notifier.messages[0] == 'READY=1'
    assert set(live_nodes(sqlite_engine).values()) == {'compute-a'}
    assert len(live_nodes(sqlite_engine)) == 5  # rack-1 only


def test_cycles_go_on_after_a_failing_one(svc, monkeypatch):
    svc.start()
    original = svc.tracker.run_cycle
    calls = []

    succeeded = threading.Semaphore(0)

    def flaky(settings):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError('database went away')
        stats = original(settings)
        succeeded.release()
        return stats

    monkeypatch.setattr(svc.tracker, 'run_cycle', flaky)
    # After the failing cycle, the next ones succeed.
    assert succeeded.acquire(timeout=10)
    assert succeeded.acquire(timeout=10)
    assert len(calls) >= 3


def test_reload_applies_mutable_options(svc, conf, fake, sqlite_engine):
    svc.start()
    conf.path.write_text(BASE.replace('partition_key = rack-1',
                                      'partition_key = rack-2\npeer_list = compute-a')
                         .replace('update_resources_interval = 1',
                                  'update_resources_interval = 2'))
    svc.reload()
    assert svc.settings.partition_key == 'rack-2'
    assert svc.settings.peer_list == ('compute-a',)
    assert svc.interval == 2


def test_reload_of_a_broken_file_keeps_the_old_values(svc, conf, caplog):
    svc.start()
    before = svc.settings
    conf.path.write_text('[ironic\npartition_key = rack-2\n')
    svc.reload()
    assert svc.settings == before
    assert 'Configuration files not reloaded' in caplog.text


@pytest.mark.parametrize('change', [
    'partition_key = not valid!',
    'partition_key = rack-1\npeer_list = compute-b,compute-c',
])
def test_reload_with_an_invalid_value_keeps_the_old_values(svc, conf, caplog, change):
    svc.start()
    before = svc.settings
    conf.path.write_text(BASE.replace('partition_key = rack-1', change))
    svc.reload()
    assert svc.settings == before
    assert 'New configuration not applied' in caplog.text


@pytest.fixture
def root_logger():
    logger = std_logging.getLogger()
    level = logger.level
    logger.setLevel(std_logging.INFO)
    yield logger
    logger.setLevel(level)


@pytest.mark.parametrize('partition_key, applied', [
    ('rack-2', True),
    ('not valid!', False),
])
def test_reload_applies_debug_only_with_a_valid_configuration(
        tmp_path, sqlite_engine, fake, root_logger, partition_key, applied):
    conf = cfg.ConfigOpts()
    oslo_logging.register_options(conf)  # and its hook that applies debug
    ic_conf.register_opts(conf)
    path = tmp_path / 'ironic-compute.conf'
    path.write_text(BASE)
    conf(['--config-file', str(path)], project='ironic-compute')
    svc = service.ComputeService(conf, ironic_client=fake, notifier=RecordingNotifier())
    svc.start()
    try:
        path.write_text(BASE.replace('partition_key = rack-1',
                                     f'partition_key = {partition_key}')
                        + '\n[DEFAULT]\ndebug = true\n')
        svc.reload()
        expected = std_logging.DEBUG if applied else std_logging.INFO
        assert root_logger.level == expected
        assert (svc.settings.partition_key == 'rack-2') is applied
    finally:
        svc.stop()


def test_heartbeats_renew_the_lease_and_forced_down_ends_it(svc, sqlite_engine):
    svc.start()
    assert svc.lease.valid and svc.instances.lease is svc.lease
    services = models.services
    with sqlite_engine.begin() as conn:
        conn.execute(services.update().values(forced_down=True))
    deadline = time.monotonic() + 10
    while svc.lease.problem() != 'the service is forced down':
        assert time.monotonic() < deadline, svc.lease.problem()
        time.sleep(0.05)
    with sqlite_engine.begin() as conn:
        conn.execute(services.update().values(forced_down=False))
    while not svc.lease.valid:
        assert time.monotonic() < deadline, svc.lease.problem()
        time.sleep(0.05)


def test_a_suspend_ends_the_lease_and_the_service_rejoins(svc, monkeypatch):
    # The machine sleeps 10 s (service_down_time is 5): CLOCK_BOOTTIME,
    # the lease's clock, jumps; the monotonic clock does not.
    slept = [0.0]
    clock_gettime = time.clock_gettime

    def boottime(clock_id):
        return clock_gettime(clock_id) + slept[0]

    monkeypatch.setattr(lease.time, 'clock_gettime', boottime)
    svc.start()
    assert svc.lease.valid
    slept[0] = 10.0
    assert 'the last good heartbeat was sent 1' in svc.lease.problem()
    # The next heartbeat renews the lease and sees that it had lapsed: the
    # next cycle heartbeats and rejoins instead of acting on its old view.
    wait_for_rejoin(svc)
    assert svc.lease.valid


def test_a_hypervisor_pause_shows_in_the_stamps_and_the_service_rejoins(
        svc, monkeypatch):
    # No local clock moves (QEMU stop/cont); the database's does: from now
    # on its stamps are 10 s later than they would have been.
    heartbeat_state = service.db_services.heartbeat_state
    paused = [datetime.timedelta(0)]
    beats = threading.Semaphore(0)

    def stamped_later(ctx, service_id, before_commit=None):
        def shifted(beat):
            return dataclasses.replace(beat, now=beat.now + paused[0])

        beat = heartbeat_state(ctx, service_id, before_commit=lambda beat: (
            before_commit and before_commit(shifted(beat))))
        beats.release()
        return shifted(beat)

    monkeypatch.setattr(service.db_services, 'heartbeat_state', stamped_later)
    svc.start()
    assert beats.acquire(timeout=10)  # a stamp from before the pause
    paused[0] = datetime.timedelta(seconds=10)
    wait_for_rejoin(svc)


def test_a_hypervisor_pause_right_after_the_start_is_seen(svc, monkeypatch):
    # The first renewal of the lease comes from the heartbeat that
    # Service.register sends, with its stamp: the first heartbeat of the
    # heartbeat thread compares its own stamp with it. Here every stamp
    # the thread gets is 10 s later (a pause before its first beat); the
    # registration's is not.
    heartbeat_state = service.db_services.heartbeat_state

    def paused_after_register(ctx, service_id, before_commit=None):
        if before_commit is None:  # the registration's
            return heartbeat_state(ctx, service_id)

        def shifted(beat):
            return dataclasses.replace(
                beat, now=beat.now + datetime.timedelta(seconds=10))

        return shifted(heartbeat_state(
            ctx, service_id,
            before_commit=lambda beat: before_commit(shifted(beat))))

    monkeypatch.setattr(service.db_services, 'heartbeat_state',
                        paused_after_register)
    svc.start()
    wait_for_rejoin(svc)


def wait_for_rejoin(svc):
    deadline = time.monotonic() + 10
    while not (svc.last_stats and svc.last_stats.skipped
               and svc.last_stats.skipped.startswith('rejoining')):
        assert time.monotonic() < deadline, svc.last_stats
        time.sleep(0.05)


def test_stop_marks_the_service_stopped(svc, sqlite_engine):
    svc.start()
    svc.stop()
    table = models.services
    with sqlite_engine.connect() as conn:
        stopped = conn.execute(sa.select(table.c.stopped_at)
                               .where(table.c.host == 'compute-a')).scalar()
    assert stopped is not None
    assert svc.notifier.messages[-1] == 'STOPPING=1'
    assert all(not t.is_alive() for t in svc._threads)


def test_stop_during_the_first_cycle_waits_for_it(svc, fake, sqlite_engine, monkeypatch):
    # systemd may stop a service whose first cycle still waits on Ironic:
    # the cycle ends before the service tells its peers it left.
    listing, release = threading.Event(), threading.Event()
    original = fake.list_nodes

    def slow_listing(**kwargs):
        listing.set()
        assert release.wait(10)
        return original(**kwargs)

    monkeypatch.setattr(fake, 'list_nodes', slow_listing)
    starter = threading.Thread(target=svc.start)
    starter.start()
    assert listing.wait(10)
    stopper = threading.Thread(target=svc.stop)
    stopper.start()
    stopper.join(0.5)
    assert stopper.is_alive()  # waiting for the cycle
    release.set()
    stopper.join(10)
    starter.join(10)
    assert not stopper.is_alive() and not starter.is_alive()
    assert svc.last_stats is not None and svc.last_stats.created == 5
    assert 'READY=1' not in svc.notifier.messages  # it was stopping by then
    table = models.services
    with sqlite_engine.connect() as conn:
        assert conn.execute(sa.select(table.c.stopped_at)).scalar() is not None


def test_a_stop_that_is_not_graceful_does_not_wait_for_the_cycle(
        svc, fake, sqlite_engine, monkeypatch):
    listing, release = threading.Event(), threading.Event()
    original = fake.list_nodes

    def slow_listing(**kwargs):
        listing.set()
        release.wait(10)
        return original(**kwargs)

    svc.start()
    monkeypatch.setattr(fake, 'list_nodes', slow_listing)
    svc.reset()  # wakes the tracker: a cycle starts and hangs on Ironic
    assert listing.wait(10)
    stopper = threading.Thread(target=svc.stop, kwargs={'graceful': False})
    stopper.start()
    stopper.join(5)
    try:
        assert not stopper.is_alive()  # it did not wait for the cycle
        table = models.services
        with sqlite_engine.connect() as conn:
            assert conn.execute(sa.select(table.c.stopped_at)).scalar() \
                is not None
    finally:
        release.set()


def test_notifier_sends_to_a_real_datagram_socket(tmp_path):
    path = str(tmp_path / 'notify')
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(2)
        notifier = systemd.Notifier({'NOTIFY_SOCKET': path, 'WATCHDOG_USEC': '5000000'})
        assert notifier.ready() and notifier.watchdog()
        assert sock.recv(64) == b'READY=1'
        assert sock.recv(64) == b'WATCHDOG=1'


def test_notifier_never_blocks_on_a_full_socket(tmp_path):
    path = str(tmp_path / 'notify')
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)  # and never read
        notifier = systemd.Notifier({'NOTIFY_SOCKET': path, 'WATCHDOG_USEC': '5000000'})
        results = [notifier.watchdog() for _ in range(2000)]
    assert results[0] is True and results[-1] is False


def test_notifier_without_socket_or_watchdog_is_silent(tmp_path):
    assert systemd.Notifier({}).ready() is False
    path = str(tmp_path / 'notify')
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        assert systemd.Notifier({'NOTIFY_SOCKET': path}).watchdog() is False


def stop_in_thread(svc, **kwargs):
    """``svc.stop(**kwargs)`` in a thread; (thread, {'seconds': ...})."""
    outcome = {}

    def run():
        start = time.monotonic()
        svc.stop(**kwargs)
        outcome['seconds'] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def stopped_at(engine):
    table = models.services
    with engine.connect() as conn:
        return conn.execute(sa.select(table.c.stopped_at)).scalar()


def test_stop_has_one_deadline_for_every_loop(svc, conf, fake, sqlite_engine, monkeypatch):
    # A cycle stuck on Ironic and a heartbeat stuck on the database: each
    # waited graceful_shutdown_timeout in turn; now they share it.
    conf.set_override('graceful_shutdown_timeout', 2)
    release = threading.Event()
    svc.start()
    listing, beating = threading.Event(), threading.Event()

    def stuck_listing(**kwargs):
        listing.set()
        release.wait(30)
        return []

    def stuck_heartbeat(ctx, service_id, before_commit=None):
        beating.set()
        release.wait(30)
        return service.db_services.Beat(None, False, False)

    monkeypatch.setattr(fake, 'list_nodes', stuck_listing)
    monkeypatch.setattr(service.db_services, 'heartbeat_state',
                        stuck_heartbeat)
    svc.reset()  # a cycle now
    assert listing.wait(10) and beating.wait(10)
    stopper, outcome = stop_in_thread(svc)
    stopper.join(10)
    try:
        assert not stopper.is_alive()
        assert outcome['seconds'] < 2 + 0.5
        assert stopped_at(sqlite_engine) is not None
    finally:
        release.set()


def test_stop_does_not_wait_for_ever_on_a_silent_database(svc, conf, monkeypatch, caplog):
    conf.set_override('graceful_shutdown_timeout', 2)
    svc.start()
    release = threading.Event()
    monkeypatch.setattr(service.db_services, 'mark_stopped',
                        lambda ctx, service_id: release.wait(30))
    stopper, outcome = stop_in_thread(svc)
    stopper.join(10)
    try:
        assert not stopper.is_alive()
        assert outcome['seconds'] < 2 + 0.5
        assert 'Could not mark the service stopped within' in caplog.text
    finally:
        release.set()


def test_stop_wakes_the_ironic_retry_waits(svc, fake):
    fake.stopping = threading.Event()
    svc.start()
    svc.stop()
    assert fake.stopping.is_set()


def test_the_stop_deadlines_split_graceful_shutdown_timeout():
    work, stop, keep = stopping.deadlines(60, graceful=True)
    assert (round(stop - work, 3), keep) == (stopping.MARK_STOPPED_TIMEOUT,
                                             stopping.MARK_STOPPED_TIMEOUT)
    work, stop, keep = stopping.deadlines(8, graceful=True)
    assert (round(stop - work, 3), keep) == (2, 2)
    # 0 is oslo's "for ever"
    assert stopping.deadlines(0, graceful=True) == (
        None, None, stopping.MARK_STOPPED_TIMEOUT)


def test_the_process_leaves_at_the_deadline_with_work_still_running(monkeypatch, caplog):
    exits = []
    monkeypatch.setattr(stopping.os, '_exit', exits.append)
    monkeypatch.setattr(stopping.std_logging, 'shutdown', lambda: None)
    release = threading.Event()
    worker = threading.Thread(target=release.wait, args=(30,), name='stuck-worker')
    worker.start()
    try:
        start = time.monotonic()
        stopping.leave_by(time.monotonic() + 0.3, finished=True)
        assert exits == [0]
        assert time.monotonic() - start < 2
        assert 'stuck-worker' in caplog.text
    finally:
        release.set()
        worker.join(5)


def test_the_process_leaves_at_once_when_instance_workers_were_left(monkeypatch):
    # Pool workers are joined at exit even when they are daemon threads.
    exits = []
    monkeypatch.setattr(stopping.os, '_exit', exits.append)
    monkeypatch.setattr(stopping.std_logging, 'shutdown', lambda: None)
    stopping.leave_by(time.monotonic() + 1, finished=False)
    assert exits == [0]
