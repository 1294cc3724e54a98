"""The ironic-compute service: heartbeat, resource tracker, signals, systemd.

oslo.service runs with its threading backend in one process (its stock
launchers fork a worker or ignore SIGHUP under that backend, see
doc/operations.md), so this module installs its own signal handlers:
SIGHUP mutates the configuration and runs a cycle at once, SIGTERM/SIGINT
finish the running cycle and mark the service stopped.
"""

import logging as std_logging
import signal
import threading

from oslo_service import backend

# Must happen before anything imports oslo_service.service or loopingcall.
backend.init_backend(backend.BackendType.THREADING)

from oslo_config import cfg  # noqa: E402
from oslo_log import log as logging  # noqa: E402
from oslo_service import service as os_service  # noqa: E402

from ironic_compute import ironic  # noqa: E402
from ironic_compute import ownership  # noqa: E402
from ironic_compute import resource_tracker  # noqa: E402
from ironic_compute import systemd  # noqa: E402
from ironic_compute.conf import validation  # noqa: E402
from ironic_compute.db import api as db_api  # noqa: E402
from ironic_compute.db import migration  # noqa: E402
from ironic_compute.db import services as db_services  # noqa: E402

LOG = logging.getLogger(__name__)


class SchemaError(Exception):
    """The database is not at the schema this code needs."""


def check_schema():
    current, head = migration.version(), migration.head()
    if current != head:
        raise SchemaError(
            f'database schema is at version {current}, this service needs '
            f'{head}: run "ironic-compute-manage db sync"')


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
        self.last_stats = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._threads = []
        self._lifecycle = threading.Lock()  # start() and stop() in turn
        # The first cycle has run; the watchdog is fed only after READY=1.
        self._started = threading.Event()

    def register(self):
        self.service_id = db_services.register(
            db_api.Context(), self.host,
            partition_key=self.settings.partition_key,
            shard=self.settings.shard)
        self.tracker = resource_tracker.ResourceTracker(
            self.host, self.service_id, self.ironic)
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
            self._spawn(self._heartbeat_loop, 'heartbeat')
            # The first cycle runs in the tracker thread too, so that a stop
            # during it waits for it like for any other cycle.
            self._spawn(self._tracker_loop, 'resource-tracker')
        self._started.wait()

    def _spawn(self, target, name):
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _heartbeat_loop(self):
        while not self._stopping.wait(self.conf.report_interval):
            try:
                db_services.heartbeat(db_api.Context(), self.service_id)
            except Exception:
                LOG.exception('Heartbeat failed; retrying in %s s',
                              self.conf.report_interval)

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
        try:
            self.last_stats = self.tracker.run_cycle(self.settings)
        except ownership.PeerListError as exc:
            LOG.error('Cycle skipped: %s', exc)
        except Exception:
            LOG.exception('Cycle failed; the next one runs in %s s',
                          self.interval)
        else:
            if self.last_stats.skipped is None and self._started.is_set():
                self.notifier.watchdog()

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
        """Finish the running cycle, then tell the peers we left."""
        with self._lifecycle:
            if self._stopping.is_set():
                return
            self._stopping.set()
            threads = list(self._threads)
        self.notifier.stopping()
        self._wake.set()
        timeout = self.conf.graceful_shutdown_timeout or None
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
