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

ComputeService is the lifecycle (register, start, reload, stop) over its
loops, each in its own module: heartbeat.py (the heartbeat and the lease),
cycles.py (the tracker's timer), watchdog.py (what systemd's watchdog
watches) and stopping.py (the deadline and the last write).
"""

import gc
import logging as std_logging
import signal
import threading
import time

from oslo_config import cfg
from oslo_log import log as logging
from oslo_service import service as os_service

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.cluster import lease
from ironic_compute.conf import validation
from ironic_compute.daemon import cycles
from ironic_compute.daemon import heartbeat
from ironic_compute.daemon import report
from ironic_compute.daemon import stopping
from ironic_compute.daemon import systemd
from ironic_compute.daemon import watchdog
from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from ironic_compute.db import services as db_services
from ironic_compute.instances import manager as instance_manager
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker
from ironic_compute.placement import claims as placement_claims
from ironic_compute.placement import sync as placement_sync

LOG = logging.getLogger(__name__)


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
        self.ironic = ironic_client or ironic.IronicClient(conf)
        self.notifier = notifier or systemd.Notifier()
        self.service_id = None
        self.tracker = None
        self.instances = None
        self._stopping = threading.Event()
        self._threads = []
        self._lifecycle = threading.Lock()  # start() and stop() in turn
        self.loops = watchdog.Loops(conf.loop_stuck_timeout)
        # No Ironic call that changes anything unless the last good
        # heartbeat was sent less than service_down_time / 2 ago, counted
        # on the lease's clock (lease.now: suspended time included).
        self.lease = lease.Lease(
            lambda: lease.margin_for(self.conf.service_down_time))
        self.heartbeat = heartbeat.Heartbeat(conf, self.lease, self.loops,
                                             self._stopping)
        self.cycles = cycles.Cycles(
            resource_tracker.Settings.from_conf(conf),
            conf.update_resources_interval, self.loops, self.notifier,
            self._stopping)

    # What the cycles run with, and their last figures (the report's).
    settings = property(lambda self: self.cycles.settings)
    interval = property(lambda self: self.cycles.interval)
    last_stats = property(lambda self: self.cycles.last_stats)

    def register(self):
        """Record this service in the database and build what it runs.

        Raises what the database raises: the process does not start
        without its row.
        """
        sent_at = lease.now()
        self.service_id = db_services.register(
            db_api.Context(), self.host,
            partition_key=self.settings.partition_key,
            shard=self.settings.shard)
        # The first renewal comes from a heartbeat, with the database's
        # stamp: the next heartbeat compares its own with it, which is how
        # a pause by the hypervisor right after the start is seen (lease.py),
        # and it says whether the service is forced down already.
        beat = db_services.heartbeat_state(db_api.Context(), self.service_id)
        self.lease.renewed(sent_at, beat.forced_down, beat.gone,
                           stamped=beat.now)
        self.instances = instance_manager.InstanceManager(
            self.conf, self.host, self.ironic, self.service_id,
            self.settings.partition_key, self.lease,
            claims=placement_claims.Claims.from_conf(self.conf))
        self.tracker = resource_tracker.ResourceTracker(
            self.host, self.service_id, self.ironic, self.instances,
            placement=placement_sync.ProviderSync.from_conf(self.conf))
        self.heartbeat.service_id = self.service_id
        self.heartbeat.tracker = self.cycles.tracker = self.tracker
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
            self.loops.watch('heartbeat', self._spawn(
                self.heartbeat.heartbeat_loop, 'heartbeat'))
            # The first cycle runs in the tracker thread too, so that a stop
            # during it waits for it like for any other cycle.
            self.loops.watch('resource-tracker', self._spawn(
                self.cycles.tracker_loop, 'resource-tracker'))
            if self.notifier.watchdog_enabled:
                self._spawn(lambda: watchdog.ping_loop(
                    self.notifier, self.loops, self.cycles.started,
                    self._stopping), 'watchdog')
            # Builds and deletes in their own pool: a slow deploy never
            # delays a cycle or a heartbeat.
            self.instances.start()
        self.cycles.started.wait()

    def _spawn(self, target, name):
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

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
        except (exception.InvalidConfig, exception.PeerListError,
                cfg.Error, ValueError) as exc:
            LOG.error('New configuration not applied, the service keeps '
                      'running with the previous values: %s', exc)
            return False
        self.cycles.settings, self.cycles.interval = settings, interval
        if self.instances is not None:
            self.instances.partition_key = settings.partition_key
        LOG.info('Configuration applied: partition_key=%s peer_list=%s '
                 'update_resources_interval=%s', settings.partition_key,
                 list(settings.peer_list), interval)
        self.cycles.wake()
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
        self.cycles.wake()
        # Waits between Ironic retries end now; a request under way ends
        # within [ironic]timeout.
        ironic_stopping = getattr(self.ironic, 'stopping', None)
        if ironic_stopping is not None:
            ironic_stopping.set()
        work_deadline, stop_deadline, keep = stopping.deadlines(
            self.conf.graceful_shutdown_timeout, graceful)
        finished = True
        if self.instances is not None:
            # Unfinished builds and deletes stay queued in the database:
            # this host resumes them when it starts again, or a live peer
            # takes them over after instance_takeover_grace.
            finished = self.instances.stop(stopping.remaining(work_deadline))
        for thread in threads:
            thread.join(stopping.remaining(work_deadline))
            if thread.is_alive():
                LOG.warning('%s did not finish within the stop deadline; '
                            'leaving anyway', thread.name)
                finished = False
        if self.service_id is not None:
            stopping.mark_stopped(self.service_id, self.host,
                                  keep if stop_deadline is None
                                  else stopping.remaining(stop_deadline))
        return finished

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
    stopping.leave_by(deadline, finished)
    return 0

