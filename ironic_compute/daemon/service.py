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

"""The ironic-compute service: heartbeat, resource tracker, signals, systemd.

oslo.service runs with its threading backend in one process (its stock
launchers fork a worker or ignore SIGHUP under that backend, see
doc/operations.md), so this module installs its own signal handlers:
SIGHUP mutates the configuration and runs a cycle at once, SIGTERM/SIGINT
finish the running cycle and mark the service stopped.
"""

import gc
import logging as std_logging
import os
import signal
import threading
import time

import sqlalchemy.exc as sa_exc
from oslo_config import cfg
from oslo_db import exception as db_exc
from oslo_log import log as logging
from oslo_service import service as os_service

from ironic_compute import ironic
from ironic_compute import text
from ironic_compute.cluster import lease
from ironic_compute.conf import validation
from ironic_compute.daemon import outage
from ironic_compute.daemon import report
from ironic_compute.daemon import systemd
from ironic_compute.daemon import watchdog
from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from ironic_compute.db import services as db_services
from ironic_compute.instances import manager as instance_manager
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker

LOG = logging.getLogger(__name__)

# Errors that mean "the database cannot be reached now": logged as one line
# with since when, not a traceback; anything else keeps its traceback.
DB_OUTAGE_ERRORS = (db_exc.DBConnectionError, db_exc.DBDeadlock,
                    sa_exc.OperationalError, sa_exc.InterfaceError,
                    sa_exc.TimeoutError)
# Of graceful_shutdown_timeout, the part kept for the mark_stopped write
# (at most MARK_STOPPED_TIMEOUT s; that bound alone when there is no
# deadline): work still running before it is left.
MARK_STOPPED_SHARE = 0.25
MARK_STOPPED_TIMEOUT = 10


SchemaError = migration.SchemaError


def check_schema():
    """Refuse a schema this code cannot run on (rules in db/migration.py)."""
    result = migration.check_schema()
    if result.state == 'newer':  # a rolling upgrade is under way
        LOG.warning('%s', result.message())


class ComputeService(os_service.Service):
    """Registers this host, heartbeats, and runs resource-tracker cycles."""

    def __init__(self, conf, ironic_client=None, notifier=None):
        super().__init__()
        self.conf = conf
        self.host = ownership.normalize_host(conf.host)
        self.settings = resource_tracker.Settings.from_conf(conf)
        self.interval = conf.update_resources_interval
        self.ironic = ironic_client or ironic.IronicClient(conf)
        self.notifier = notifier or systemd.Notifier()
        self.service_id = None
        self.tracker = None
        self.instances = None
        self.last_stats = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._threads = []
        self._lifecycle = threading.Lock()  # start() and stop() in turn
        # The first cycle has run; the watchdog is fed only after READY=1.
        self._started = threading.Event()
        self.loops = watchdog.Loops(conf.loop_stuck_timeout)
        self._last_heartbeat = None  # time.monotonic() of the last success
        # No Ironic call that changes anything unless the last good
        # heartbeat was sent less than service_down_time / 2 ago.
        self.lease = lease.Lease(lambda: self.conf.service_down_time / 2)
        self._db_outage = outage.Outage('The database (cycles)')

    def register(self):
        sent_at = time.monotonic()
        self.service_id = db_services.register(
            db_api.Context(), self.host,
            partition_key=self.settings.partition_key,
            shard=self.settings.shard)
        self._last_heartbeat = time.monotonic()
        self.lease.renewed(sent_at)
        self.instances = instance_manager.InstanceManager(
            self.conf, self.host, self.ironic, self.service_id,
            self.settings.partition_key, self.lease)
        self.tracker = resource_tracker.ResourceTracker(
            self.host, self.service_id, self.ironic, self.instances)
        LOG.info('Service %s registered (id %s); partition_key=%s '
                 'peer_list=%s', self.host, self.service_id,
                 self.settings.partition_key, list(self.settings.peer_list))

    def start(self):
        """Start heartbeat and cycles; return once the first cycle ran."""
        if self.service_id is None:
            self.register()
        with self._lifecycle:
            if self._stopping.is_set():
                return
            # Heartbeat from the start: a first cycle that waits on Ironic
            # must not make the peers think this service is down.
            self.loops.watch('heartbeat',
                             self._spawn(self._heartbeat_loop, 'heartbeat'))
            # The first cycle runs in the tracker thread too, so that a stop
            # during it waits for it like for any other cycle.
            self.loops.watch('resource-tracker', self._spawn(
                self._tracker_loop, 'resource-tracker'))
            if self.notifier.watchdog_enabled:
                self._spawn(self._watchdog_loop, 'watchdog')
            # Builds and deletes in their own pool: a slow deploy never
            # delays a cycle or a heartbeat.
            self.instances.start()
        self._started.wait()

    def _spawn(self, target, name):
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _heartbeat_loop(self):
        db_outage = outage.Outage('The database (heartbeat)')
        while not self._stopping.wait(self.conf.report_interval):
            with self.loops.turn('heartbeat'):
                sent_at = time.monotonic()
                try:
                    beat = db_services.heartbeat_state(db_api.Context(),
                                                       self.service_id)
                except DB_OUTAGE_ERRORS as exc:
                    self.tracker.database_lost()
                    LOG.error('Heartbeat failed: the database is unreachable '
                              '%s; retrying in %s s', db_outage.failed(exc),
                              self.conf.report_interval)
                    continue
                except Exception:
                    self.tracker.database_lost()
                    LOG.exception('Heartbeat failed; retrying in %s s',
                                  self.conf.report_interval)
                    continue
            db_outage.ended(LOG)
            self.lease.renewed(sent_at, beat.forced_down, beat.gone)
            self._heartbeat_done(time.monotonic())

    def _heartbeat_done(self, now):
        gap, self._last_heartbeat = now - self._last_heartbeat, now
        if gap > self.conf.service_down_time / 2:
            # Paused (SIGSTOP, a frozen VM) or cut off: the peers may have
            # judged us dead and taken our rows meanwhile.
            LOG.warning('No heartbeat for %.0f s (more than half of '
                        'service_down_time): rejoining', gap)
            self.tracker.lease_lapsed()

    def _watchdog_loop(self):
        # systemd advises pinging at half WatchdogSec; a third leaves room
        # for a loaded host.
        interval = self.notifier.watchdog_usec / 3e6
        reported = None
        while not self._stopping.wait(interval):
            if not self._started.is_set():
                continue
            problem = self.loops.problem()
            if problem is None:
                self.notifier.watchdog()
            elif reported is None:  # once per spell, not every check
                LOG.error('Watchdog: %s; WATCHDOG=1 is no longer sent, so '
                          'systemd restarts the service after WatchdogSec',
                          problem)
            reported = problem

    def _tracker_loop(self):
        try:
            self._run_cycle()
            if not self._stopping.is_set():
                self.notifier.ready()
        finally:
            self._started.set()
        while True:
            self._wake.wait(self.interval)
            if self._stopping.is_set():
                return
            self._wake.clear()
            self._run_cycle()

    def _run_cycle(self):
        # Cycles never overlap: only the tracker thread runs them.
        with self.loops.turn('resource-tracker'):
            try:
                self.last_stats = self.tracker.run_cycle(self.settings)
            except ownership.PeerListError as exc:
                LOG.error('Cycle skipped: %s', exc)
            except DB_OUTAGE_ERRORS as exc:
                self.tracker.database_lost()
                LOG.error('Cycle failed: the database is unreachable %s; the '
                          'next one runs in %s s',
                          self._db_outage.failed(exc), self.interval)
            except Exception as exc:
                if isinstance(exc, db_exc.DBError):
                    self.tracker.database_lost()
                LOG.exception('Cycle failed; the next one runs in %s s',
                              self.interval)
            else:
                self._db_outage.ended(LOG)

    def reset(self):
        """Apply the mutated configuration; keep the old values if invalid.

        Returns whether the configuration was applied.
        """
        try:
            validation.validate(self.conf)
            settings = resource_tracker.Settings.from_conf(self.conf)
            interval = self.conf.update_resources_interval
            ownership.ring_peers({self.host}, self.host,
                                 settings.partition_key, settings.peer_list)
        except (validation.InvalidConfig, ownership.PeerListError,
                cfg.Error, ValueError) as exc:
            LOG.error('New configuration not applied, the service keeps '
                      'running with the previous values: %s', exc)
            return False
        self.settings, self.interval = settings, interval
        if self.instances is not None:
            self.instances.partition_key = settings.partition_key
        LOG.info('Configuration applied: partition_key=%s peer_list=%s '
                 'update_resources_interval=%s', settings.partition_key,
                 list(settings.peer_list), interval)
        self._wake.set()
        return True

    def reload(self):
        """SIGHUP: re-read the config files, then reset()."""
        # oslo.log applies a new ``debug`` while the files are re-read; a
        # refused configuration puts the previous level back.
        root_level = std_logging.getLogger().level
        try:
            self.conf.mutate_config_files()
        except Exception as exc:
            LOG.error('Configuration files not reloaded, the service keeps '
                      'running with the previous values: %s',
                      validation.redact(exc))
            applied = False
        else:
            applied = self.reset()
        if not applied:
            std_logging.getLogger().setLevel(root_level)

    def stop(self, graceful=True):
        """Leave within graceful_shutdown_timeout, telling the peers.

        Graceful: the running cycle, heartbeat and instance steps may finish
        until one deadline (graceful_shutdown_timeout less what is kept for
        mark_stopped); whatever still runs then is left. Not graceful: no
        wait. Either way mark_stopped is attempted, bounded too. Returns
        whether every loop and instance worker finished.
        """
        with self._lifecycle:
            if self._stopping.is_set():
                return True
            self._stopping.set()
            threads = list(self._threads)
        self.notifier.stopping()
        self._wake.set()
        # Waits between Ironic retries end now; a request under way ends
        # within [ironic]timeout.
        ironic_stopping = getattr(self.ironic, 'stopping', None)
        if ironic_stopping is not None:
            ironic_stopping.set()
        work_deadline, stop_deadline, keep = self._stop_deadlines(graceful)
        finished = True
        if self.instances is not None:
            # Unfinished builds and deletes stay queued in the database:
            # this host resumes them when it starts again, or a live peer
            # takes them over after instance_takeover_grace.
            finished = self.instances.stop(_remaining(work_deadline))
        for thread in threads:
            thread.join(_remaining(work_deadline))
            if thread.is_alive():
                LOG.warning('%s did not finish within the stop deadline; '
                            'leaving anyway', thread.name)
                finished = False
        if self.service_id is not None:
            self._mark_stopped(keep if stop_deadline is None
                               else _remaining(stop_deadline))
        return finished

    def _stop_deadlines(self, graceful):
        """(work deadline, stop deadline, seconds kept for mark_stopped).

        Deadlines are time.monotonic() values, None for no bound: a
        graceful_shutdown_timeout of 0 means "wait for ever", as in
        oslo.service.
        """
        now = time.monotonic()
        total = self.conf.graceful_shutdown_timeout
        if not graceful:
            return now, None, MARK_STOPPED_TIMEOUT
        if not total:
            return None, None, MARK_STOPPED_TIMEOUT
        keep = min(MARK_STOPPED_TIMEOUT, total * MARK_STOPPED_SHARE)
        return now + total - keep, now + total, keep

    def _mark_stopped(self, timeout):
        """Tell the peers we left, giving up after ``timeout`` s: a database
        that accepts and never answers must not keep the process alive."""
        def write():
            try:
                db_services.mark_stopped(db_api.Context(), self.service_id)
            except DB_OUTAGE_ERRORS as exc:
                LOG.error('Could not mark the service stopped, the database '
                          'is unreachable (%s); peers take its nodes after '
                          'service_down_time', text.one_line(exc, 300))
            except Exception:
                LOG.exception('Could not mark the service stopped; peers '
                              'take its nodes after service_down_time')
            else:
                LOG.info('Service %s stopped; its peers take its nodes at '
                         'their next cycle', self.host)

        writer = threading.Thread(target=write, name='mark-stopped',
                                  daemon=True)
        writer.start()
        writer.join(timeout)
        if writer.is_alive():
            LOG.error('Could not mark the service stopped within %.1f s (the '
                      'database does not answer); peers take its nodes after '
                      'service_down_time', timeout)

    def wait(self):
        self._stopping.wait()


def run(conf):
    """Run the service in this process until SIGTERM/SIGINT; return 0."""
    check_schema()
    svc = ComputeService(conf)
    svc.register()
    requests = {'reload': threading.Event(), 'stop': threading.Event()}
    wake = threading.Event()

    def on_signal(signo, _frame):
        requests['reload' if signo == signal.SIGHUP else 'stop'].set()
        wake.set()

    for signo in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(signo, on_signal)
    report.setup(conf, svc)  # SIGUSR2: Guru Meditation Report
    # What start-up loaded lives as long as the process: out of the
    # collector's scans, so collections during cycles stay short. Once, at
    # start: no cycle pauses the collector (that would be process-wide).
    gc.freeze()
    launcher = os_service.Launcher(conf, restart_method='mutate')
    launcher.launch_service(svc)
    while not requests['stop'].is_set():
        wake.wait(1.0)
        wake.clear()
        if requests['reload'].is_set():
            requests['reload'].clear()
            LOG.info('SIGHUP: reloading the configuration')
            svc.reload()
    LOG.info('Stopping')
    # The same deadline as stop()'s: graceful_shutdown_timeout from now.
    total = conf.graceful_shutdown_timeout
    deadline = time.monotonic() + total if total else None
    finished = svc.stop(graceful=True)
    launcher.stop()
    _leave_by(deadline, finished)
    return 0


def _remaining(deadline):
    """Seconds left until ``deadline`` (time.monotonic(); None: no bound)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0)


def _leave_by(deadline, finished):
    """Exit at ``deadline`` at the latest, even with work still running.

    At exit Python waits for every non-daemon thread (the launcher's, which
    may still wait for a first cycle) and for every worker of a thread pool
    (daemon or not): one stuck on a request would hold the process past
    graceful_shutdown_timeout. ``finished``: stop() saw every loop and
    worker end. What is left is resumed by whoever manages the work next.
    """
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join(_remaining(deadline))
    left = sorted(t.name for t in threading.enumerate()
                  if t is not me and not t.daemon and t.is_alive())
    if finished and not left:
        return
    LOG.warning('Leaving with work still running (%s); it is resumed by '
                'whoever manages it next',
                ', '.join(left) or 'instance workers')
    std_logging.shutdown()  # flush the log: os._exit() will not
    os._exit(0)
