#!/usr/bin/env python3
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

"""Benchmark building instances: N ironic-compute services, a real Ironic, a burst of requests.

Starts a standalone Ironic (``ironic_compute.harness.ironic``, fake hardware, a temporary state
directory, free ports) on a MariaDB database of its own (made on the local server through the
``openstack_citest`` user, dropped at the end; ``--ironic-db sqlite``: its SQLite file, whose
locking fails allocations under this load), creates the nodes and makes them buildable,
starts ``--services`` ``ironic-compute`` daemons on one database (PostgreSQL through the
``openstack_citest`` user when it answers, else one SQLite file), then asks for
``--instances`` instances at once without a host, as ``ironic-compute-manage instance
create`` does (the same scheduler call, from a pool of threads in this process: 200 CLI
processes would spend minutes of CPU starting Python on a small machine, and that is not
what is measured). It prints:

* instances per second, from the burst to the last instance ``active``;
* p50/p95 of the time from the burst to each instance ``active``, and from its record;
* with ``--rounds N`` (2 by default) the builds run N times, alternating Ironic alone and
  the services (the instances deleted between two rounds, the services stopped while
  Ironic alone builds, as in the first round), and the ratio of each round
  is printed with their median and spread: one run moves by 10 % and more;
* the same figures for Ironic alone, measured first in the same run (``--no-direct``: not):
  the calls a build sends (allocation among the nodes, image, deploy, power on), from
  ``--services`` x ``max_concurrent_builds`` threads with ironicclient and no ironic-compute,
  its nodes undeployed before the services start; and the ratio of the two;
* the resource-tracker cycle time (the daemons' ``Cycle: ... in X s`` log lines) while
  idle before the burst, while the builds run, and idle again with every instance built;
* for each instance action (stop, start, reboot, rebuild), asked for ``--action-instances``
  built instances at once as ``ironic-compute-manage instance ACTION`` does (the same
  database call, in this process): p50/p95 of the time from asking to done (the row has no
  task left), beside Ironic's own time for the same call (soft power off, power on, soft
  reboot, rebuild) sent with ironicclient to the same nodes at once (10 threads: what
  Ironic's API serves at once), from the burst to Ironic showing it done, as the
  services are timed, ``--action-rounds`` times in turn, and how much longer the
  services' median is (target: at most 0.5 s); beside it, Ironic alone timed from each
  node's own call (its wait for a thread left out); and the wall time of one real
  ``instance ACTION UUID --wait`` process (Python's start-up and the CLI's 0.5 s poll
  included). The power-state sync is
  off in these services, so that Ironic's own calls are not undone.

    python tools/bench_instances.py [--instances 200] [--services 3] [--nodes N]
                                    [--action-instances 20] [--action-rounds 3]
                                    [--rounds 2]
                                    [--database auto|postgresql|sqlite]
                                    [--ironic-db mysql|sqlite] [--no-direct] [--keep]

Exits 1, saying why, unless every instance asked for ends ``active``. With ``--keep``
everything is left running and the script says how to look and how to stop it.
"""

import argparse
import collections
import concurrent.futures
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid as uuidlib

import sqlalchemy as sa
from ironicclient import exc as ironic_exc

from ironic_compute import conf as ic_conf
from ironic_compute.conf import instances as instances_conf
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.harness import databases
from ironic_compute.harness import fleet
from ironic_compute.harness import ironic as standalone
from ironic_compute.harness.bench import BenchError
from ironic_compute.harness.bench import open_database
from ironic_compute.harness.bench import percentile
from ironic_compute.harness.bench import say
from ironic_compute.instances import model as inst

RESOURCE_CLASS = standalone.DEFAULT_RESOURCE_CLASS
CYCLE = 5  # update_resources_interval: a few cycles in each phase
REPORT_INTERVAL = 2
# Generous: a 2-core machine building 200 instances must not see live peers as down.
SERVICE_DOWN_TIME = 30
IDLE_CYCLES = 3  # cycles per service in each idle phase
REQUEST_THREADS = 10
BUILD_TIMEOUT = 900.0
SETTLE_TIMEOUT = 180.0
# [ironic]deploy_timeout; a build waits a third of it for an allocation. Ironic on SQLite
# now and then leaves an allocation "allocating" for ever ("database is locked" in its
# conductor): the build gives up on it after that time and reserves again.
DEPLOY_TIMEOUT = 60
ACTION_TIMEOUT = 300.0
# The actions in the order they are measured: each leaves the instances as the next needs
# them (stop -> stopped -> start -> active...). For each: the CLI's arguments and the call
# Ironic gets for it, with ironicclient.
ACTIONS = (
    ('stop', {'hard': False}, 'soft power off'),
    ('start', {}, 'power on'),
    ('reboot', {'hard': False}, 'soft reboot'),
    ('rebuild', {'image': 'http://images.example.com/bench.qcow2'}, 'rebuild'),
)
# With an image: Ironic 39.0 answers a rebuild of a node whose instance_info has no
# image_source with HTTP 500 (UnboundLocalError 'auto_lessee' in start_deploy), and the
# instances here are built without one.
# Ironic alone: seconds between two reads of an allocation or a node (the services' first
# poll interval), and the allocations a build makes before giving up (as manager.py).
DIRECT_POLL = 0.5
ALLOCATION_ATTEMPTS = 3
# Ironic alone: HTTP 500s a call may meet in a row before the bench gives up.
DIRECT_500_RETRIES = 3
# Seconds an action may take through the services beyond Ironic alone, at the median
# (issue 29, item 13).
ACTION_TARGET = 0.5
NODE_POLL = 0.1  # seconds between two reads of Ironic or the database while measuring
CYCLE_LINE = re.compile(r'Cycle: .* in ([0-9.]+)s')
RETRY_LINE = 'no node reserved'

_instances = sa.table('instances', sa.column('uuid'), sa.column('host'), sa.column('node'),
                      sa.column('vm_state'), sa.column('task_state'), sa.column('fault'),
                      sa.column('deleted'))


# --------------------------------------------------------------------------- set-up


def open_ironic_database(choice):
    """(ProvisionedDatabase or None, label) for Ironic: a fresh MariaDB database for
    'mysql', None (its SQLite file) for 'sqlite'."""
    if choice == 'sqlite':
        # IronicServer would otherwise take a database from the environment.
        os.environ.pop('IRONIC_DATABASE_URL', None)
        return None, 'SQLite'
    try:
        return databases.ProvisionedDatabase('mysql'), 'MariaDB'
    except databases.DatabaseUnavailable as exc:
        raise BenchError(f"no MariaDB database for Ironic ({str(exc).splitlines()[0]}); "
                         'or run with --ironic-db sqlite') from None


def make_nodes(client, count):
    """``count`` fake nodes, available and powered off (an allocation needs a power state)."""
    say(f'  creating {count} nodes, then manage, provide, power off (a few minutes)')
    started = time.monotonic()
    uuids = standalone.create_nodes(client, count, name_prefix='bench', workers=4)
    standalone.make_buildable(client, uuids, timeout=300)
    say(f'  {count} nodes created, available and powered off in '
        f'{time.monotonic() - started:.0f} s')
    return uuids


def daemon_options(host, workdir, db_url, ironic_url, extra=()):
    """The options of one service: the bench's, then ``extra`` ((section, name, value)
    of --set)."""
    options = {
        'DEFAULT': {
            'host': host, 'state_path': workdir,
            'report_interval': REPORT_INTERVAL, 'service_down_time': SERVICE_DOWN_TIME,
            'update_resources_interval': CYCLE, 'graceful_shutdown_timeout': 20,
            # max_concurrent_builds, instance_poll_interval: the defaults
            # Off: the actions' phase sends Ironic calls behind the services' back.
            'sync_power_state_interval': 0,
        },
        'database': {'connection': db_url},
        'ironic': {'auth_type': 'none', 'endpoint_override': ironic_url,
                   'deploy_timeout': DEPLOY_TIMEOUT},
    }
    for section, name, value in extra:
        options.setdefault(section, {})[name] = value
    return options


def service_option(text):
    """SECTION.NAME=VALUE of --set: (section, name, value); ValueError otherwise."""
    key, sep, value = text.partition('=')
    section, dot, name = key.partition('.')
    if not (sep and dot and section and name):
        raise ValueError(f'{text!r}: expected SECTION.NAME=VALUE')
    return section, name, value


class Cluster(fleet.Fleet):
    """The daemons, their database and what the benchmark reads of it."""

    def __init__(self, count, workdir, db_url, ironic_url, extra=()):
        super().__init__(workdir, db_url, manage_options={
            'service_down_time': SERVICE_DOWN_TIME, 'report_interval': REPORT_INTERVAL})
        for i in range(1, count + 1):
            self.add(f'compute-{i}', daemon_options(f'compute-{i}', workdir, db_url,
                                                    ironic_url, extra))

    def start(self, nodes):
        done = self.manage('db', 'sync')
        if done.returncode != 0:
            raise BenchError(f'db sync failed: {done.stderr.strip()}')
        self.start_again(nodes)

    def start_again(self, nodes):
        """Start every service and wait until they hold ``nodes`` as free."""
        for daemon in self.daemons.values():
            daemon.start()
            time.sleep(0.5)  # registrations one after the other (SQLite)
        self.wait_free(nodes)

    def stop_all(self):
        """Stop every service (SIGTERM, as systemd does); start_again() brings them back."""
        for daemon in self.daemons.values():
            if daemon.stop() != 0:
                raise BenchError(f'{daemon.host} exited with {daemon.process.returncode} on '
                                 f'SIGTERM:\n{daemon.log()[-2000:]}')

    def wait_free(self, nodes):
        """Wait until the services hold every node of ``nodes`` as free, settled for two
        cycles."""
        hosts = set(self.daemons)
        last, since = None, time.monotonic()

        def settled():
            nonlocal last, since
            self.check_daemons()
            rows = self.node_rows()
            holders = {u: h for u, (h, _) in rows.items()}
            if holders != last:
                last, since = holders, time.monotonic()
            return (len(rows) == len(nodes) and all(h in hosts and free
                                                    for h, free in rows.values())
                    and time.monotonic() - since >= 2 * CYCLE + 1)

        fleet.wait_until(settled, SETTLE_TIMEOUT, 0.5,
                         f'{len(nodes)} free nodes held by the {len(hosts)} services')

    def instances(self):
        with self.engine.connect() as conn:
            return conn.execute(sa.select(_instances.c.uuid, _instances.c.host,
                                          _instances.c.node, _instances.c.vm_state,
                                          _instances.c.task_state, _instances.c.fault)
                                .where(_instances.c.deleted == 0)).all()

    def log_offsets(self):
        return {d.host: os.path.getsize(d.log_path) if os.path.exists(d.log_path) else 0
                for d in self.daemons.values()}

    def cycles_since(self, offsets, until=None):
        """{host: [seconds]} of the cycles logged after ``offsets`` (and before ``until``)."""
        found = {}
        for daemon in self.daemons.values():
            with open(daemon.log_path, 'rb') as f:
                f.seek(offsets[daemon.host])
                size = None if until is None else until[daemon.host] - offsets[daemon.host]
                text = f.read(size).decode(errors='replace')
            found[daemon.host] = [float(m.group(1)) for m in CYCLE_LINE.finditer(text)]
        return found

    def count_in_logs(self, text):
        return sum(daemon.count_in_log(text) for daemon in self.daemons.values())

    def wait_cycles(self, offsets, count):
        fleet.wait_until(
            lambda: self.check_daemons() or all(len(c) >= count
                                        for c in self.cycles_since(offsets).values()),
            count * CYCLE + 60, 0.5, f'{count} cycles of every service')

# --------------------------------------------------------------------------- the burst


def ask(count, service_down_time):
    """Record ``count`` build requests at once (the scheduler call of ``instance create``).

    Returns ({uuid: monotonic time its record was committed}, the burst's start).
    """
    spec = inst.RequestSpec(resource_class=RESOURCE_CLASS)
    recorded = {}
    lock = threading.Lock()

    def one(index):
        uuid = str(uuidlib.uuid4())
        db_scheduling.schedule_and_create(db_api.Context(), uuid, f'bench-{index:04d}', spec,
                                          '', service_down_time)
        with lock:
            recorded[uuid] = time.monotonic()

    burst = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(REQUEST_THREADS) as pool:
        for future in [pool.submit(one, i) for i in range(count)]:
            future.result()
    return recorded, burst


def watch(cluster, uuids, timeout):
    """Poll until every instance is active or in error: {uuid: (monotonic, row)}."""
    done = {}
    deadline = time.monotonic() + timeout
    last_print = time.monotonic()
    while len(done) < len(uuids):
        cluster.check_daemons()
        now = time.monotonic()
        for row in cluster.instances():
            if row.uuid in uuids and row.uuid not in done and row.vm_state in (
                    inst.ACTIVE, inst.ERROR):
                done[row.uuid] = (now, row)
        if now - last_print >= 10:
            last_print = now
            say(f'  ... {sum(r.vm_state == inst.ACTIVE for _, r in done.values())} '
                f'of {len(uuids)} active')
        if now > deadline:
            raise BenchError(f'{len(uuids) - len(done)} instances neither active nor in '
                             f'error after {timeout:.0f} s')
        time.sleep(0.2)
    return done


def delete_all(cluster, uuids):
    """Delete the instances of ``uuids`` through the services (as ``instance delete``
    does) and wait until every one is gone."""
    for uuid in uuids:
        db_instances.request_delete(db_api.Context(), uuid)
    fleet.wait_until(lambda: cluster.check_daemons() or not (
        {row.uuid for row in cluster.instances()} & set(uuids)),
        BUILD_TIMEOUT, 0.5, f'{len(uuids)} instances deleted')


# --------------------------------------------------------------------------- Ironic alone


def build_threads():
    """The builds the services run at once: --services x max_concurrent_builds' default."""
    return next(opt.default for opt in instances_conf.opts
                if opt.name == 'max_concurrent_builds')


class DirectBuilds:
    """The ceiling: the calls a build sends, from the same number of threads, straight to
    Ironic, with no ironic-compute at all.

    Per build, as instances/provision.py and manager.py send them: an allocation named and
    identified by a new uuid among ``candidates`` (made again, up to the same number of
    attempts, when it ends in error), polled until no longer ``allocating``; the image set
    in instance_info; provision state ``active``, polled until Ironic ends the deploy; power
    on (fake hardware deploys a node as it was, off), polled until on. Each poll is one GET
    every DIRECT_POLL seconds (the services' first poll interval, without their back-off).
    Each thread has its own client (one connection pool each). A call Ironic answers with
    HTTP 500 is sent again, after a read where sending it twice would matter (_send).
    """

    NODE_FIELDS = ['uuid', 'provision_state', 'target_provision_state', 'last_error',
                   'power_state', 'target_power_state']

    def __init__(self, url, candidates):
        self.url = url
        self.candidates = list(candidates)
        self._local = threading.local()

    def _client(self):
        if getattr(self._local, 'client', None) is None:
            self._local.client = standalone.make_client(self.url)
        return self._local.client

    @staticmethod
    def _poll(read, finished, what):
        deadline = time.monotonic() + DEPLOY_TIMEOUT
        while True:
            value = read()
            if finished(value):
                return value
            if time.monotonic() > deadline:
                raise BenchError(f'Ironic alone: {what} not done after {DEPLOY_TIMEOUT} s')
            time.sleep(DIRECT_POLL)

    def _send(self, call, taken=None):
        """``call``, retried while Ironic is busy (a locked node, a 503). An HTTP 500
        (under this load, Ironic's API now and then loses its own RPC connection to
        its conductor: "Remote end closed connection without response") is retried
        too, as a careful client would: at once for a call that can be sent twice,
        and for one that cannot (``taken``, a read saying whether Ironic took it)
        only when that read says it did not."""
        for attempt in range(DIRECT_500_RETRIES + 1):
            try:
                return standalone.retry_locked(call)
            except Exception as exc:
                if getattr(exc, 'http_status', None) != 500 or attempt == DIRECT_500_RETRIES:
                    raise
                say(f'  Ironic alone: HTTP 500, read and sent again: {str(exc)[:160]}')
                time.sleep(DIRECT_POLL)
                if taken is not None and taken():
                    return None

    def _reserve(self, client, uuid):
        error = None

        def allocation_made():
            try:
                client.allocation.get(uuid)
                return True
            except ironic_exc.NotFound:
                return False
        for _ in range(ALLOCATION_ATTEMPTS):
            self._send(lambda: client.allocation.create(
                uuid=uuid, name=uuid, resource_class=RESOURCE_CLASS,
                candidate_nodes=self.candidates), taken=allocation_made)
            allocation = self._poll(lambda: client.allocation.get(uuid),
                                    lambda a: a.state != 'allocating', f'allocation {uuid}')
            if allocation.state == 'active':
                return allocation.node_uuid
            error = allocation.last_error
            self._send(lambda: client.allocation.delete(uuid))
        raise BenchError(f'Ironic alone: no node reserved for {uuid}: {error}')

    def _read(self, client, node):
        return client.node.get(node, fields=self.NODE_FIELDS)

    @staticmethod
    def _powering_on(node):
        return 'power on' in (node.power_state, node.target_power_state)

    def build(self):
        """One build; the monotonic time Ironic showed its node active and on."""
        client = self._client()
        uuid = str(uuidlib.uuid4())
        node = self._reserve(client, uuid)
        self._send(lambda: client.node.update(node, [
            {'op': 'add', 'path': '/instance_info/image_source', 'value': ''},
            {'op': 'add', 'path': '/instance_info/root_gb', 'value': '0'}]))
        self._send(lambda: client.node.set_provision_state(node, 'active'),
                   taken=lambda: self._read(client, node).provision_state != 'available')
        state = self._poll(lambda: self._read(client, node),
                           lambda n: n.target_provision_state is None and (
                               n.provision_state in ('active', 'deploy failed', 'error')),
                           f'deploy of {node}')
        if state.provision_state != 'active':
            raise BenchError(f'Ironic alone: deploy of {node} ended {state.provision_state}: '
                             f'{state.last_error}')
        self._send(lambda: client.node.set_power_state(node, 'on'),
                   taken=lambda: self._powering_on(self._read(client, node)))
        self._poll(lambda: self._read(client, node),
                   lambda n: n.target_power_state is None and n.power_state == 'power on',
                   f'power on of {node}')
        return time.monotonic()

    def run(self, count, threads):
        """``count`` builds from ``threads`` threads: (the burst's start, [done times])."""
        burst = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            done = [f.result() for f in [pool.submit(self.build) for _ in range(count)]]
        return burst, done


def measure_direct(server, client, nodes, count, threads):
    """Ironic alone on ``nodes``, then every node undeployed and powered off (available
    again, its allocation gone, as before): {'rate', 'p50', 'p95', 'span'}."""
    say(f'  Ironic alone: {count} builds from {threads} threads, no ironic-compute')
    burst, done = DirectBuilds(server.url, nodes).run(count, threads)
    figures = figures_of([t - burst for t in done])
    say(f"  Ironic alone: {figures['rate']:.2f} instances/s, p50 {figures['p50']:.1f} s, "
        f"p95 {figures['p95']:.1f} s; undeploying its nodes")
    standalone.tear_down(client, nodes, timeout=BUILD_TIMEOUT)
    # As they were before it (an undeployed fake node stays on): the builds through the
    # services power each node on too.
    standalone.power_off(client, nodes, timeout=BUILD_TIMEOUT)
    return figures


def figures_of(from_burst):
    span = max(from_burst)
    return {'rate': len(from_burst) / span, 'span': span,
            'p50': percentile(from_burst, 0.5), 'p95': percentile(from_burst, 0.95)}


# --------------------------------------------------------------------------- the actions


def ask_action(action, uuids, action_args):
    """Queue ``action`` on every instance of ``uuids`` at once, as ``instance ACTION``
    does; {uuid: monotonic time just before its request}."""
    asked = {}

    def one(uuid):
        asked[uuid] = time.monotonic()
        db_instances.request_action(db_api.Context(), uuid, action, **action_args)

    with concurrent.futures.ThreadPoolExecutor(REQUEST_THREADS) as pool:
        for future in [pool.submit(one, u) for u in uuids]:
            future.result()
    return asked


def wait_actions(cluster, action, asked):
    """Poll the database until no instance of ``asked`` has a task: {uuid: seconds from
    its request to the first read that saw it done}. BenchError on a fault."""
    took = {}
    deadline = time.monotonic() + ACTION_TIMEOUT
    while len(took) < len(asked):
        cluster.check_daemons()
        now = time.monotonic()
        for row in cluster.instances():
            if row.uuid in asked and row.uuid not in took and row.task_state is None:
                if row.fault:
                    raise BenchError(f'instance {action} of {row.uuid} failed: {row.fault}')
                took[row.uuid] = now - asked[row.uuid]
        if now > deadline:
            raise BenchError(f'{len(asked) - len(took)} instances not done with {action} '
                             f'after {ACTION_TIMEOUT:.0f} s')
        time.sleep(NODE_POLL)
    return took


class IronicAlone:
    """The call an action makes, sent to Ironic directly with ironicclient."""

    FIELDS = ['power_state', 'target_power_state', 'provision_state',
              'target_provision_state', 'provision_updated_at', 'driver_internal_info']

    def __init__(self, client):
        self.client = client

    def nodes(self, uuids):
        return {n['uuid']: n for n in standalone.list_nodes(self.client, fields=self.FIELDS)
                if n['uuid'] in uuids}

    def send(self, call, node):
        if call == 'soft power off':
            self.client.node.set_power_state(node, 'off', soft=True)
        elif call == 'power on':
            self.client.node.set_power_state(node, 'on')
        elif call == 'soft reboot':
            self.client.node.set_power_state(node, 'reboot', soft=True)
        else:
            self.client.node.set_provision_state(node, 'rebuild')

    @staticmethod
    def done(call, before, now):
        """Whether ``now`` (the node as listed) shows ``call`` done, from ``before``."""
        if now['target_power_state'] or now['target_provision_state']:
            return False
        if call == 'soft power off':
            return now['power_state'] == 'power off'
        if call == 'power on':
            return now['power_state'] == 'power on'
        if call == 'soft reboot':
            changed = 'last_power_state_change'
            return (now['power_state'] == 'power on' and (now['driver_internal_info'] or {})
                    .get(changed) != (before['driver_internal_info'] or {}).get(changed))
        return (now['provision_state'] == 'active'
                and now['provision_updated_at'] != before['provision_updated_at'])

    def measure(self, call, nodes):
        """Send ``call`` to every node at once, from REQUEST_THREADS threads (Ironic's API
        serves 10 requests at once: cheroot's default threads, with a listen backlog of
        5, resets the connections of a larger burst): {node: (seconds from the burst
        to done, seconds from its own call to done)}. The first is the services'
        measure (from the request, the wait for a turn included); the second leaves
        out the wait of a call for a free thread."""
        before = self.nodes(set(nodes))
        sent, took = {}, {}

        def one(node):
            sent[node] = time.monotonic()
            self.send(call, node)

        with concurrent.futures.ThreadPoolExecutor(REQUEST_THREADS) as pool:
            burst = time.monotonic()
            futures = [pool.submit(one, n) for n in nodes]
            deadline = time.monotonic() + ACTION_TIMEOUT
            while len(took) < len(nodes):
                for future in futures:
                    if future.done() and future.exception() is not None:
                        raise BenchError(f"Ironic's {call} failed: {future.exception()}")
                for node, now in self.nodes(set(sent) - set(took)).items():
                    if self.done(call, before[node], now):
                        seen = time.monotonic()
                        took[node] = (seen - burst, seen - sent[node])
                if time.monotonic() > deadline:
                    raise BenchError(f"Ironic's {call} not done on {len(nodes) - len(took)} "
                                     f'nodes after {ACTION_TIMEOUT:.0f} s')
                time.sleep(NODE_POLL)
            for future in futures:
                future.result()
        return took


def cli_wait(cluster, action, action_args, uuid):
    """Seconds one real ``instance ACTION UUID --wait`` process takes."""
    options = [f'--{name}' if value is True else f'--{name}={value}'
               for name, value in action_args.items() if value not in (None, False)]
    started = time.monotonic()
    done = cluster.manage('instance', action, uuid, *options, '--wait',
                          '--timeout', str(ACTION_TIMEOUT), timeout=ACTION_TIMEOUT + 60)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise BenchError(f'instance {action} {uuid} --wait failed: {done.stderr.strip()}')
    return took


def measure_actions(cluster, client, count, rounds):
    """Each action on ``count`` active instances at once, through the services, then the
    same call to their nodes through Ironic alone, ``rounds`` times in turn (one burst
    of 20 moves by a few tenths of a second from one run to the next); one CLI --wait
    per action at the end. [(action, call, [s through the services], [s Ironic alone
    from the burst], [s Ironic alone from its call], cli s)], the seconds of every
    instance of every round."""
    active = sorted((row for row in cluster.instances() if row.vm_state == inst.ACTIVE),
                    key=lambda row: row.uuid)
    chosen, spare = active[:count], active[count] if len(active) > count else active[0]
    node_of = {row.uuid: row.node for row in chosen}
    alone = IronicAlone(client)
    results = [[action, call, [], [], [], action_args]
               for action, action_args, call in ACTIONS]
    for number in range(1, rounds + 1):
        for result in results:
            action, call, took, *_alone, action_args = result
            done = wait_actions(cluster, action, ask_action(action, list(node_of),
                                                            action_args))
            took.extend(done.values())
            say(f'  round {number}: instance {action} of {len(chosen)} instances at once: '
                f'all done {max(done.values()):.1f} s after the request')
        # Ironic alone, on the same nodes, in the same order (they end active and on).
        for result in results:
            done = alone.measure(result[1], list(node_of.values()))
            result[3].extend(from_burst for from_burst, _ in done.values())
            result[4].extend(from_call for _, from_call in done.values())
            say(f"  round {number}: Ironic's {result[1]} of the same {len(chosen)} nodes "
                f'at once: all done {max(b for b, _ in done.values()):.1f} s after the burst')
    for result in results:
        result.append(cli_wait(cluster, result[0], result[5], spare.uuid))
        say(f'  ironic-compute-manage instance {result[0]} {spare.uuid} --wait: '
            f'{result[-1]:.1f} s')
    return [(action, call, took, alone, alone_call, cli)
            for action, call, took, alone, alone_call, _args, cli in results]


def report_actions(results, count, rounds):
    say()
    say(f'Instance actions ({count} instances at once, {rounds} rounds; seconds, p50 / '
        'p95, from the burst to done; Ironic alone: the same call with ironicclient on '
        f'the same nodes, {REQUEST_THREADS} at a time; target: p50 within '
        f'{ACTION_TARGET} s of Ironic alone; the last two columns count Ironic alone '
        "from each node's own call instead, leaving out its wait for a thread):")
    rows = [('action', 'through ironic-compute', "Ironic's call", 'Ironic alone',
             'p50 more', 'one CLI --wait', 'alone from its call', 'p50 more than that')]
    for action, call, took, alone, alone_call, cli in results:
        more = percentile(took, 0.5) - percentile(alone, 0.5)
        more_call = percentile(took, 0.5) - percentile(alone_call, 0.5)
        rows.append((action, spread(took), call, spread(alone),
                     f'{more:+.2f}' + ('' if more <= ACTION_TARGET else ' (over)'),
                     f'{cli:.1f}', spread(alone_call), f'{more_call:+.2f}'))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        say(('  ' + '  '.join(cell.ljust(width)
                              for cell, width in zip(row, widths, strict=True))).rstrip())


def spread(values):
    values = list(values)
    return f'{percentile(values, 0.5):.1f} / {percentile(values, 0.95):.1f}'


def cycle_summary(per_host):
    values = [s for seconds in per_host.values() for s in seconds]
    if not values:
        return 'no cycle logged'
    return (f'median {statistics.median(values):.2f} s, max {max(values):.2f} s '
            f'({len(values)} cycles)')


def run(args, workdir):
    say(f'Benchmark: {args.instances} instances on {args.services} services, '
        f'{args.nodes} fake nodes (state in {workdir})')
    if args.service_options:
        say("  the services' options over the bench's: " + ', '.join(
            f'[{section}]{name} = {value}' for section, name, value in args.service_options))
    ironic_db, ironic_label = open_ironic_database(args.ironic_db)
    say(f"  Ironic's database: {ironic_label}"
        + (f' ({ironic_db.name}, dropped at the end)' if ironic_db else ''))
    server = standalone.IronicServer(state_dir=os.path.join(workdir, 'ironic'), port=0,
                                     groups=[''], die_with_parent=not args.keep,
                                     log=lambda msg: say(f'  [ironic] {msg}'),
                                     database_url=ironic_db.url if ironic_db else None)
    cluster = database = None
    try:
        server.start()
        standalone.isolate_version_cache(os.path.join(workdir, 'cache'))
        client = standalone.make_client(server.url)
        nodes = make_nodes(client, args.nodes)
        database, label = open_database(args.database)
        say(f'  database: {label}')
        label = f"services on {label}, Ironic on {ironic_label}"
        cluster = Cluster(args.services, workdir, database.url, server.url,
                          args.service_options)
        ic_conf.register_opts(ic_conf.CONF)
        ic_conf.CONF([], project='ironic-compute', default_config_files=[])
        ic_conf.CONF.set_override('connection', database.url, 'database')
        rounds, threads = [], args.services * build_threads()
        for number in range(1, args.rounds + 1):
            say(f'Round {number} of {args.rounds}')
            direct = None
            if args.direct:
                # Ironic alone, then the services, in every round: one run moves by 10 %
                # and more, so the ratio is taken per round, each against its own Ironic
                # alone. Every Ironic alone runs with no service up: idle services list
                # every node each cycle, which cost Ironic's one process about a tenth
                # of its time on a slow machine and made the later rounds' ratios
                # flatter the services.
                if number > 1:
                    say('  stopping the services while Ironic alone builds')
                    cluster.stop_all()
                direct = measure_direct(server, client, nodes, args.instances, threads)
            if number == 1:
                cluster.start(nodes)
            elif args.direct:
                cluster.start_again(nodes)
            else:
                cluster.wait_free(nodes)
            say(f'  {args.services} services hold the {len(nodes)} free nodes '
                f'(update_resources_interval {CYCLE} s; builds: the default '
                'max_concurrent_builds and instance_poll_interval)')
            active, busy = build_round(args, cluster, label, direct, threads)
            rounds.append((direct, active, busy))
            if number < args.rounds:
                say(f'  deleting the {len(active)} instances of round {number}')
                delete_all(cluster, list(active))
                standalone.power_off(client, nodes, timeout=BUILD_TIMEOUT)
        if args.direct and args.rounds > 1:
            report_rounds(rounds)
        if args.action_instances:
            count = min(args.action_instances, len(active) - 1)
            say()
            say(f'  instance actions: each asked for {count} instances at once, then '
                "Ironic's own call sent to their nodes at once")
            report_actions(measure_actions(cluster, client, count, args.action_rounds),
                           count, args.action_rounds)
    finally:
        if args.keep:
            say()
            say(f'Left running (--keep): Ironic {server.url}; services '
                + ', '.join(f'{d.host} (pid {d.process.pid})'
                            for d in (cluster.daemons.values() if cluster else []) if d.alive))
            if cluster:
                say(f'  look: ironic-compute-manage --config-file {cluster.manage_config} '
                    'instance list')
                say('  stop: kill ' + ' '.join(str(d.process.pid) for d in cluster.daemons.values()
                                                if d.alive)
                    + f'; python tools/ironic_standalone.py stop --state-dir {workdir}/ironic'
                    + (f'; then drop the MariaDB database {ironic_db.name}' if ironic_db else ''))
        else:
            if cluster:
                cluster.close()
            server.stop(quiet=True)
            if database:
                database.drop()
            if ironic_db:
                ironic_db.drop()
            say(f'  logs: {workdir}/compute-*.log, {workdir}/ironic/log/')


def build_round(args, cluster, label, direct, threads):
    """One burst of builds through the services, reported (beside ``direct``, Ironic
    alone in the same round, when measured): ({uuid: monotonic time active}, the cycles
    while building {host: [s]})."""
    idle_from = cluster.log_offsets()
    cluster.wait_cycles(idle_from, IDLE_CYCLES)
    busy_from = cluster.log_offsets()
    idle = cluster.cycles_since(idle_from, busy_from)
    say(f'  asking for {args.instances} instances at once ({REQUEST_THREADS} threads)')
    recorded, burst = ask(args.instances, SERVICE_DOWN_TIME)
    scheduled = max(recorded.values()) - burst
    say(f'  all {args.instances} recorded {scheduled:.1f} s after the burst; '
        'waiting for them to be active')
    done = watch(cluster, set(recorded), BUILD_TIMEOUT)
    busy_to = cluster.log_offsets()
    busy = cluster.cycles_since(busy_from, busy_to)
    cluster.wait_cycles(busy_to, IDLE_CYCLES)
    after = cluster.cycles_since(busy_to)
    errors = [row for _, row in done.values() if row.vm_state != inst.ACTIVE]
    active = {u: t for u, (t, row) in done.items() if row.vm_state == inst.ACTIVE}
    if not active:  # no figure to report
        raise BenchError(not_all_active(errors, len(recorded)))
    per_host = collections.Counter(row.host for _, row in done.values())
    report(args, label, burst, recorded, active, scheduled, idle, busy, after, per_host,
           len({row.node for _, row in done.values() if row.node}),
           cluster.count_in_logs(RETRY_LINE))
    if direct is not None:
        report_direct(figures_of([t - burst for t in active.values()]), direct, busy,
                      threads)
    for row in errors[:5]:
        say(f'  error: {row.uuid} on {row.host}: {(row.fault or "")[:300]}')
    if errors:
        raise BenchError(not_all_active(errors, len(recorded)))
    return {uuid: t - burst for uuid, t in active.items()}, busy


def report_rounds(rounds):
    """Every round's ratio (services / Ironic alone of the same round), their median and
    spread, and the cycle while building over all rounds."""
    ratios = []
    say()
    say(f'Builds over {len(rounds)} rounds (instances/s; ratio = services / Ironic alone '
        'of the same round):')
    rows = [('round', 'Ironic alone', 'through ironic-compute', 'ratio', 'p95 ratio')]
    for number, (direct, active, _busy) in enumerate(rounds, 1):
        project = figures_of(list(active.values()))
        ratios.append(project['rate'] / direct['rate'])
        rows.append((str(number), f"{direct['rate']:.2f}", f"{project['rate']:.2f}",
                     f'{ratios[-1]:.2f}', f"{project['p95'] / direct['p95']:.2f}x"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        say(('  ' + '  '.join(cell.ljust(width)
                              for cell, width in zip(row, widths, strict=True))).rstrip())
    say(f'  median ratio {statistics.median(ratios):.2f} (spread {min(ratios):.2f} to '
        f'{max(ratios):.2f}, {len(ratios)} rounds)')
    busy = {}
    for _direct, _active, per_host in rounds:
        for host, seconds in per_host.items():
            busy.setdefault(host, []).extend(seconds)
    say(f'  cycle while building, all rounds: {cycle_summary(busy)}')


def not_all_active(errors, asked):
    """Why the run failed: how many instances ended in error, and their faults by kind."""
    kinds = collections.Counter(
        "Ironic's failure" if 'Ironic:' in (row.fault or '') else 'another fault'
        for row in errors)
    first = (errors[0].fault or 'no fault recorded').splitlines()[0][:200]
    return (f'{asked - len(errors)} of {asked} instances active, {len(errors)} in error ('
            + ', '.join(f'{n} after {kind}' for kind, n in sorted(kinds.items()))
            + f'); first fault: {first}')


def report(args, label, burst, recorded, active, scheduled, idle, busy, after, per_host,
           distinct_nodes, retries):
    from_burst = [t - burst for t in active.values()]
    from_record = [t - recorded[u] for u, t in active.items()]
    span = max(from_burst) if from_burst else float('nan')
    rows = [
        ('instances active', f'{len(active)} of {len(recorded)} on {distinct_nodes} nodes'),
        ('per service', ', '.join(f'{h} {n}' for h, n in sorted(per_host.items()))),
        ('reservations tried again', f'{retries} (lost a race for a node, or Ironic failed)'),
        ('all recorded (scheduler)', f'{scheduled:.1f} s after the burst '
                                     f'({len(recorded) / scheduled:.0f} requests/s)'),
        ('instances per second', f'{len(active) / span:.1f}  (burst to last active: '
                                 f'{span:.1f} s)'),
        ('to active, from the burst', f'p50 {percentile(from_burst, 0.5):.1f} s, '
                                      f'p95 {percentile(from_burst, 0.95):.1f} s'),
        ('to active, from its record', f'p50 {percentile(from_record, 0.5):.1f} s, '
                                       f'p95 {percentile(from_record, 0.95):.1f} s'),
        ('cycle, idle before', cycle_summary(idle)),
        ('cycle, while building', cycle_summary(busy)),
        ('cycle, idle after (built)', cycle_summary(after)),
    ]
    width = max(len(name) for name, _ in rows)
    say()
    say(f'Results ({label}, {args.services} services, {args.nodes} nodes, '
        f'{len(recorded)} instances asked for at once, fake hardware):')
    for name, value in rows:
        say(f'  {name.ljust(width)}  {value}')


def report_direct(project, direct, busy, threads):
    """The builds through the services beside Ironic alone, measured in the same run."""
    say()
    say(f'Builds side by side (Ironic alone: the same calls from {threads} threads, '
        'no ironic-compute, before the services started):')
    rows = [('', 'instances/s', 'p50', 'p95'),
            ('through ironic-compute', f"{project['rate']:.2f}", f"{project['p50']:.1f} s",
             f"{project['p95']:.1f} s"),
            ('Ironic alone', f"{direct['rate']:.2f}", f"{direct['p50']:.1f} s",
             f"{direct['p95']:.1f} s"),
            ('ratio', f"{project['rate'] / direct['rate']:.2f}",
             f"{project['p50'] / direct['p50']:.2f}x", f"{project['p95'] / direct['p95']:.2f}x")]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        say(('  ' + '  '.join(cell.ljust(width)
                              for cell, width in zip(row, widths, strict=True))).rstrip())
    say(f'  cycle while building: {cycle_summary(busy)}')


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='tools/bench_instances.py',
        description='Build a burst of instances on several ironic-compute services and a '
                    'real standalone Ironic; print the rate, the time to active and the '
                    'cycle times; then time each instance action against Ironic alone.')
    parser.add_argument('--instances', type=int, default=200,
                        help='instances asked for at once [%(default)s]')
    parser.add_argument('--services', type=int, default=3,
                        help='ironic-compute services [%(default)s]')
    parser.add_argument('--nodes', type=int, default=None,
                        help='fake nodes [at least 200, and 10%% more than --instances]')
    parser.add_argument('--action-instances', type=int, default=20,
                        help='instances each action is asked for at once, after the builds '
                             '(0: no actions) [%(default)s]')
    parser.add_argument('--action-rounds', type=int, default=3,
                        help='rounds of the actions, each through the services then '
                             'Ironic alone; the percentiles pool them [%(default)s]')
    parser.add_argument('--database', choices=('auto', 'postgresql', 'sqlite'),
                        default='auto',
                        help='auto: PostgreSQL (openstack_citest) when reachable, else '
                             'SQLite [%(default)s]')
    parser.add_argument('--ironic-db', choices=('mysql', 'sqlite'), default='mysql',
                        help="Ironic's database: mysql, a MariaDB database made for the run "
                             '(openstack_citest on 127.0.0.1) and dropped at the end; sqlite, '
                             'its own SQLite file, which fails allocations under this load '
                             '[%(default)s]')
    parser.add_argument('--direct', action=argparse.BooleanOptionalAction, default=True,
                        help='first build --instances instances through Ironic alone (the '
                             'same calls, services x max_concurrent_builds threads, no '
                             'ironic-compute), undeploy them, and print that ceiling beside '
                             'the figures [%(default)s]')
    parser.add_argument('--rounds', type=int, default=2,
                        help='rounds of builds, each Ironic alone then the services, the '
                             'instances deleted between two rounds; the median ratio and '
                             'its spread are printed [%(default)s]')
    parser.add_argument('--set', dest='service_options', metavar='SECTION.NAME=VALUE',
                        type=service_option, action='append', default=[],
                        help="an option of every service's configuration, over the "
                             "bench's own (repeatable), e.g. "
                             'DEFAULT.max_concurrent_ironic_requests=4')
    parser.add_argument('--keep', action='store_true',
                        help='leave Ironic and the services running at the end')
    args = parser.parse_args(argv)
    if min(args.instances, args.services, args.rounds, args.action_rounds) < 1:
        parser.error('--instances, --services, --rounds and --action-rounds must be at '
                     'least 1')
    if args.action_instances < 0 or (args.action_instances
                                     and args.action_instances >= args.instances):
        parser.error('--action-instances must be 0 or less than --instances (one more '
                     'instance is the CLI --wait one)')
    if args.nodes is None:
        args.nodes = max(200, args.instances + max(10, args.instances // 10))
    if args.nodes < args.instances:
        parser.error(f'--nodes {args.nodes} cannot hold --instances {args.instances}')
    workdir = tempfile.mkdtemp(prefix='bench-instances-')
    signal.signal(signal.SIGTERM, _interrupt)  # stop what was started, as on Ctrl-C
    try:
        run(args, workdir)
    except (BenchError, AssertionError, TimeoutError) as exc:
        print(f'bench_instances: error: {exc}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('bench_instances: interrupted', file=sys.stderr)
        return 130
    return 0


def _interrupt(_signo, _frame):
    raise KeyboardInterrupt


if __name__ == '__main__':
    sys.exit(main())
