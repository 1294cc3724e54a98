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

from oslo_service import backend

# Must happen before anything imports oslo_service.service or loopingcall.
backend.init_backend(backend.BackendType.THREADING)

import sqlalchemy.exc as sa_exc  # noqa: E402
from oslo_config import cfg  # noqa: E402
from oslo_db import exception as db_exc  # noqa: E402
from oslo_log import log as logging  # noqa: E402
from oslo_service import service as os_service  # noqa: E402

from ironic_compute import instance_manager  # noqa: E402
from ironic_compute import ironic  # noqa: E402
from ironic_compute import lease  # noqa: E402
from ironic_compute import outage  # noqa: E402
from ironic_compute import ownership  # noqa: E402
from ironic_compute import report  # noqa: E402
from ironic_compute import resource_tracker  # noqa: E402
from ironic_compute import systemd  # noqa: E402
from ironic_compute import watchdog  # noqa: E402
from ironic_compute.conf import validation  # noqa: E402
from ironic_compute.db import api as db_api  # noqa: E402
from ironic_compute.db import migration  # noqa: E402
from ironic_compute.db import services as db_services  # noqa: E402

LOG = logging.getLogger(__name__)

# Errors that mean "the database cannot be reached now": logged as one line
# with since when, not a traceback; anything else keeps its traceback.
DB_OUTAGE_ERRORS = (db_exc.DBConnectionError, db_exc.DBDeadlock,
                    sa_exc.OperationalError, sa_exc.InterfaceError,
                    sa_exc.TimeoutError)
# Tests only: while the file this names exists, the tracker thread hangs
# before its next cycle (to test that the watchdog stops the pings).
_HANG_FILE_ENV = 'IRONIC_COMPUTE_TEST_HANG_FILE'


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
            self._hang_for_tests()
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

    @staticmethod
    def _hang_for_tests():
        path = os.environ.get(_HANG_FILE_ENV)
        while path and os.path.exists(path):
            time.sleep(0.1)

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
        """Tell the peers we left; first, if ``graceful``, let the running
        cycle and instance steps finish (up to graceful_shutdown_timeout)."""
        with self._lifecycle:
            if self._stopping.is_set():
                return
            self._stopping.set()
            threads = list(self._threads)
        self.notifier.stopping()
        self._wake.set()
        # Not graceful: leave at once; the peers' conditional updates make
        # a cycle cut short harmless.
        timeout = (self.conf.graceful_shutdown_timeout or None) if graceful \
            else 0
        if self.instances is not None:
            # Unfinished builds and deletes stay queued in the database:
            # this host resumes them when it starts again, or a live peer
            # takes them over after instance_takeover_grace.
            self.instances.stop(timeout)
        for thread in threads:
            thread.join(timeout)
            if thread.is_alive():
                LOG.warning('%s did not finish within %s s; leaving anyway',
                            thread.name, timeout)
        if self.service_id is not None:
            try:
                db_services.mark_stopped(db_api.Context(), self.service_id)
                LOG.info('Service %s stopped; its peers take its nodes at '
                         'their next cycle', self.host)
            except Exception:
                LOG.exception('Could not mark the service stopped; peers '
                              'take its nodes after service_down_time')

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
    svc.stop(graceful=True)
    launcher.stop()
    return 0
