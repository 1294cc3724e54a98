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

"""Instance actions end to end: stop, start, reboot, rebuild and the power-state sync.

test_instances' cluster (three real daemons, each through its own proxy to the real
standalone Ironic, fake hardware; MariaDB and PostgreSQL) with fewer nodes and a
power-state sync every SYNC_INTERVAL seconds. The proxies read HTTP (the harness's
HttpProxy): they count each daemon's requests to Ironic and can lose Ironic's answer to
one. Actions are asked for with ``ironic-compute-manage instance
stop|start|reboot|rebuild``, as an operator would. Ironic's side is read with
ironicclient and, to count what its conductor did, from the conductor's log: it logs one
"Successfully set node N power state to S by A" line per power action it carries out
(none when the node is in the state asked already) and one "Node N moved to provision
state" line per provision state change; its API logs one line per request it answered.
With ``IRONIC_URL`` (an Ironic the session did not start, whose logs it cannot read)
those counts are skipped and "once" rests on the proxies' counts, the services' logs and
the node's ``last_power_state_change``. The tests of the class share one cluster; each
builds the instances it needs first, so any one of them runs alone.
"""

import collections
import json
import os
import random
import re
import threading
import time
import urllib.parse

import sqlalchemy as sa

from ironic_compute.harness import ironic as standalone
from tests.functional import daemons
from tests.functional import test_instances
from tests.unit.test_configdrive import NETWORK
from tests.unit.test_configdrive import public_key

HOSTS = test_instances.HOSTS
GROUP = test_instances.GROUP
SERVICE_DOWN_TIME = test_instances.SERVICE_DOWN_TIME
# Longer than test_instances' grace: between the host being seen down and the
# takeover, `instance show` (a CLI process: a second on a quiet machine, up to
# ten on a loaded one, seen on CI) must catch the task waiting.
TAKEOVER_GRACE = 20
REPORT_INTERVAL = test_instances.REPORT_INTERVAL
SYNC_INTERVAL = 2  # [DEFAULT]sync_power_state_interval
NEW_IMAGE = 'http://images.example.com/rebuilt.qcow2'
# Waits, not bounds: long enough for a loaded 2-core machine.
ACTION_TIMEOUT = 60
TAKEOVER_WAIT = SERVICE_DOWN_TIME + TAKEOVER_GRACE + 2 * test_instances.CYCLE + 30
# What the sync is allowed beyond its interval: one pass (a listing and a few
# writes) on a loaded machine, and the test's own polling.
SYNC_SLACK = 3.0
# And to power a node off again: a soft power off, which the service polls for
# 0.5 s after asking, then 1.5 times further apart.
POWER_OFF_SLACK = 3.0
# The loop of actions against the sync: how long actions are asked for, and every
# how many turns of an instance's loop its node is powered behind the services' back
# first (off when the instance is active, on when it is stopped).
LOOP_SECONDS = 60
BEHIND_EVERY = 2
# How long the proxies hold the answer to each power-state sync's listing during the
# loop: a slow Ironic, which leaves an action time to run its course between the
# sync's listing and its writes.
SYNC_LISTING_DELAY = 3.0
# How long the loop watches an instance after an action that raced a change behind
# the services' back: a sync pass that began before the action ends within it.
QUIET = SYNC_INTERVAL + SYNC_LISTING_DELAY + 1
# What each action leaves the instance in, when it is done, and its node's power.
DONE = {'stop': 'stopped', 'start': 'active', 'reboot': 'active'}
POWER = {'active': 'power on', 'stopped': 'power off'}

_instances = sa.table('instances', sa.column('uuid'), sa.column('host'),
                      sa.column('vm_state'), sa.column('task_state'),
                      sa.column('power_state'), sa.column('generation'),
                      sa.column('fault'), sa.column('deleted'), sa.column('task_args'))

State = collections.namedtuple('State', 'host vm_state task_state power_state generation fault')

_POWER_LINE = re.compile(
    r'Successfully set node (?P<node>[0-9a-f-]{36}) power state to (?P<target>[a-z ]+) '
    r'by (?P<action>[a-z ]+)\.')
# Ironic's API (39: ironic.api.middleware.request_log) logs one line per request it
# answered: "[None req-UUID ...] 127.0.0.1 - PUT /v1/nodes/N/states/power - 202 (12.3ms)".
# (The conductor's power action lines do not tell which request they serve: its
# worker threads log the request id of whichever request that thread served first.)
_API_LINE = re.compile(
    r'\[\S* (?P<request>req-[0-9a-f-]+)[^\]]*\] \S+ - (?P<method>[A-Z]+) (?P<path>\S+) - '
    r'(?P<status>\w+) \(')
_PROVISION_LINE = re.compile(
    r'Node (?P<node>[0-9a-f-]{36}) moved to provision state "(?P<state>[^"]*)" '
    r'from state "(?P<previous>[^"]*)"')


class ConductorLog:
    """What the conductor of GROUP did, from its log, and the requests Ironic's API
    answered, from the main process's log (a managed Ironic only)."""

    def __init__(self, ironic):
        self.path = self.api_path = None
        if ironic.managed:
            self.path = ironic.server.log_path(standalone.process_name(GROUP))
            self.api_path = ironic.server.log_path(standalone.MAIN_PROCESS)

    def mark(self):
        """Where the log ends now: read what comes after with the methods below."""
        return os.path.getsize(self.path) if self.path else 0

    def api_mark(self):
        """Where the API's log ends now (for :meth:`api_requests`)."""
        return os.path.getsize(self.api_path) if self.api_path else 0

    @staticmethod
    def _read(path, since):
        with open(path, 'rb') as f:
            f.seek(since)
            return f.read().decode(errors='replace')

    def _lines(self, since, pattern, node):
        if self.path is None:
            return None
        return [m for m in pattern.finditer(self._read(self.path, since)) if m['node'] == node]

    def api_requests(self, method, path, since):
        """[(status, request id)] of the ``method`` ``path`` requests the API answered
        after ``since``; None without the log."""
        if self.api_path is None:
            return None
        return [(m['status'], m['request'])
                for m in _API_LINE.finditer(self._read(self.api_path, since))
                if (m['method'], m['path']) == (method, path)]

    def power_actions(self, node, since):
        """[(target, action)] the conductor carried out on ``node`` after ``since``,
        e.g. ('power on', 'soft rebooting'); None without the log."""
        found = self._lines(since, _POWER_LINE, node)
        return None if found is None else [(m['target'], m['action']) for m in found]

    def provision_states(self, node, since):
        """The provision states ``node`` went through after ``since``; None without
        the log."""
        found = self._lines(since, _PROVISION_LINE, node)
        return None if found is None else [m['state'] for m in found]


class ActionCluster(test_instances.InstanceCluster):
    """test_instances' cluster with a power-state sync every SYNC_INTERVAL s and a
    takeover grace of TAKEOVER_GRACE s."""

    # Room for the six active instances of the dead-host test (and a seventh
    # it may build to rescue), the stopped ones the loop test may leave, and
    # a free node on every host.
    node_count = 13
    # Counts each daemon's requests to Ironic, and can lose an answer.
    proxy_class = daemons.HttpProxy

    def __init__(self, backend, workdir, ironic):
        super().__init__(backend, workdir, ironic)
        self.conductor = ConductorLog(ironic)

    def _options(self, host, *urls):
        options = super()._options(host, *urls)
        options['DEFAULT'].update(sync_power_state_interval=SYNC_INTERVAL,
                                  instance_takeover_grace=TAKEOVER_GRACE)
        return options

    def ready(self):
        for proxy in self.proxies.values():
            proxy.clear()  # no answer lost or held any more
        super().ready()

    def act(self, action, uuid, *args):
        """``instance ACTION UUID args... --format json``: (CompletedProcess, record)."""
        done = self.manage('instance', action, uuid, '--format', 'json', *args)
        return done, (json.loads(done.stdout) if done.stdout.strip() else None)

    def state(self, uuid):
        """The live row's host, states and generation, read now."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(
                _instances.c.host, _instances.c.vm_state, _instances.c.task_state,
                _instances.c.power_state, _instances.c.generation, _instances.c.fault)
                .where(_instances.c.uuid == uuid, _instances.c.deleted == 0)).one()
        return State(*row)

    def node(self, node):
        return self.client.node.get(node, fields=[
            'power_state', 'target_power_state', 'provision_state',
            'target_provision_state', 'instance_uuid', 'allocation_uuid',
            'instance_info', 'driver_internal_info', 'provision_updated_at'])

    def power_changed_at(self, node):
        """Ironic's ``driver_internal_info.last_power_state_change`` of ``node``."""
        return self.node(node).driver_internal_info.get('last_power_state_change')

    def wait_power(self, node, power_state):
        return daemons.wait_until(
            lambda: (lambda n: n if n.power_state == power_state
                     and n.target_power_state is None else None)(self.node(node)),
            ACTION_TIMEOUT, 0.1, f'node {node} {power_state}')

    def power_behind_our_back(self, instance, target, line):
        """Power the node of ``instance`` ``target`` ('on', 'off') through
        Ironic, as someone else would; (the conductor log's mark before,
        how often its host had logged ``line`` before, when Ironic showed
        it done)."""
        seen = self.daemons[instance.host].count_in_log(line)
        mark = self.conductor.mark()
        self.client.node.set_power_state(instance.node, target)
        self.wait_power(instance.node, f'power {target}')
        return mark, seen, time.monotonic()

    def stopped_on(self, hosts):
        """The stopped instances with no task, managed by one of ``hosts``."""
        return sorted((i for i in self.instances().values()
                       if i.host in hosts and i.vm_state == 'stopped'
                       and i.task_state is None), key=lambda i: i.uuid)

    def with_stopped(self):
        """A stopped instance on a live host: one stopped if there is none."""
        if not self.stopped_on(self.live_hosts()):
            self.with_active(1)
            uuid = self.active_on(self.live_hosts())[0].uuid
            done, record = self.act('stop', uuid, '--wait', '--timeout', str(ACTION_TIMEOUT))
            assert done.returncode == 0 and record['vm_state'] == 'stopped', done.stderr


started_cluster = daemons.started_on_each_backend(ActionCluster)



def stored_configdrive(ironic, node):
    """The config drive Ironic's conductor stored in the node's instance_info
    (its API shows ``******``), read from Ironic's database; None for an Ironic
    the session did not start."""
    if ironic.server is None:
        return None
    server = ironic.server
    url = server.database_url or f'sqlite:///{server.files.db_path}'
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            info = conn.execute(sa.text('SELECT instance_info FROM nodes WHERE uuid = :n'),
                                {'n': node}).scalar()
    finally:
        engine.dispose()
    return json.loads(info).get('configdrive')


def the_syncs_listing(method, target, body):
    """Whether a request to Ironic is a power-state sync's listing: the nodes with an
    instance, with ironic.FIELDS (the polls' shared listing asks for fewer fields, and
    the resource tracker's for the nodes with or without an instance)."""
    parts = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(parts.query)
    return ((method, parts.path.rstrip('/')) == ('GET', '/v1/nodes')
            and query.get('associated') == ['True']
            and 'properties' in query.get('fields', [''])[0].split(','))


def assert_done(done, record, vm_state, power_state):
    assert done.returncode == 0, done.stderr
    assert (record['vm_state'], record['task_state'], record['power_state'],
            record['fault'], record['waiting']) == (vm_state, None, power_state, None,
                                                    None), record


class TestInstanceActions:
    def test_stop_start_reboot_rebuild(self, cluster):
        cluster.with_active(1)
        instance = cluster.active_on(HOSTS)[0]
        uuid, node = instance.uuid, instance.node
        log = cluster.conductor
        before = cluster.node(node)
        # Builds end with the node powered on, or the sync would call them stopped.
        assert (before.power_state, before.provision_state) == ('power on', 'active')
        allocation = before.allocation_uuid
        assert allocation is not None

        mark = log.mark()
        done, record = cluster.act('stop', uuid, '--wait', '--timeout', str(ACTION_TIMEOUT))
        assert_done(done, record, 'stopped', 'off')
        state = cluster.node(node)
        assert (state.power_state, state.provision_state) == ('power off', 'active')
        # Soft first: the fake power interface supports a soft power off.
        assert log.power_actions(node, mark) in (None, [('power off', 'soft power off')])

        mark = log.mark()
        done, record = cluster.act('start', uuid, '--wait', '--timeout', str(ACTION_TIMEOUT))
        assert_done(done, record, 'active', 'on')
        state = cluster.node(node)
        assert (state.power_state, state.provision_state) == ('power on', 'active')
        assert log.power_actions(node, mark) in (None, [('power on', 'power on')])

        mark, changed = log.mark(), cluster.power_changed_at(node)
        done, record = cluster.act('reboot', uuid, '--wait', '--timeout', str(ACTION_TIMEOUT))
        assert_done(done, record, 'active', 'on')
        state = cluster.node(node)
        assert state.power_state == 'power on'
        assert state.driver_internal_info['last_power_state_change'] != changed
        assert log.power_actions(node, mark) in (None, [('power on', 'soft rebooting')])

        mark, updated = log.mark(), state.provision_updated_at
        done, record = cluster.act('rebuild', uuid, '--image', NEW_IMAGE, '--wait',
                                   '--timeout', str(ACTION_TIMEOUT))
        assert_done(done, record, 'active', 'on')
        assert (record['node'], record['image_source']) == (node, NEW_IMAGE), record
        state = cluster.node(node)
        assert (state.power_state, state.provision_state, state.instance_uuid) == (
            'power on', 'active', uuid)
        assert state.provision_updated_at != updated
        assert state.instance_info.get('image_source') == NEW_IMAGE
        # There is no "rebuilding" provision state: active -> deploying -> active.
        assert log.provision_states(node, mark) in (None, ['deploying', 'active'])
        assert log.power_actions(node, mark) in (None, [])  # a deploy leaves the power be
        # The same node, the same allocation.
        assert state.allocation_uuid == allocation
        assert [(a['uuid'], a['node_uuid'], a['state'])
                for a in cluster.allocations_of(uuid)] == [(allocation, node, 'active')]
        print(f'{uuid} on {node}: stop, start, reboot, rebuild each done once '
              f'({"counted in the conductor log" if log.path else "no conductor log"})')
        cluster.assert_consistent('after the four actions')

    def test_rescue_unrescue_and_the_console(self, cluster, tmp_path):
        cluster.with_active(1)
        instance = cluster.active_on(cluster.live_hosts())[0]
        uuid, node = instance.uuid, instance.node
        daemon = cluster.daemons[instance.host]
        password = f'rescue-{uuid[:8]} "pw"'
        secret = tmp_path / 'rescue-password'
        secret.write_text(password + '\n')
        log = cluster.conductor
        mark, updated = log.mark(), cluster.node(node).provision_updated_at
        done, record = cluster.act('rescue', uuid, '--password-file', str(secret),
                                   '--wait', '--timeout', str(ACTION_TIMEOUT))
        assert done.returncode == 0, done.stderr
        assert (record['vm_state'], record['task_state'], record['fault']) == (
            'rescued', None, None), record
        state = cluster.node(node)
        assert (state.provision_state, state.instance_uuid) == ('rescue', uuid)
        assert state.provision_updated_at != updated
        # Fake hardware rescues at once, with no ramdisk: active -> rescuing -> rescue.
        assert log.provision_states(node, mark) in (None, ['rescuing', 'rescue'])
        # Refused while rescued: its node runs the ramdisk.
        refused, _ = cluster.act('stop', uuid)
        assert refused.returncode == 1 and 'it is rescued' in refused.stderr, refused

        mark = log.mark()
        done, record = cluster.act('unrescue', uuid, '--wait', '--timeout',
                                   str(ACTION_TIMEOUT))
        assert done.returncode == 0, done.stderr
        assert (record['vm_state'], record['task_state'], record['fault']) == (
            'active', None, None), record
        assert cluster.node(node).provision_state == 'active'
        assert log.provision_states(node, mark) in (None, ['unrescuing', 'active'])
        # The password was never logged, nor left on the row.
        assert password not in daemon.log()
        with cluster.engine.connect() as conn:
            assert conn.execute(sa.select(_instances.c.task_args).where(
                _instances.c.uuid == uuid, _instances.c.deleted == 0)).scalar() is None

        # The console: the CLI asks Ironic itself, so it needs the [ironic] options.
        config = tmp_path / 'console.conf'
        config.write_text(open(cluster.manage_config).read()
                          + f'\n[ironic]\nauth_type = none\n'
                          f'endpoint_override = {cluster.ironic.url}\n')
        for args, enabled in (((), True), (('--disable',), False)):
            done = daemons.manage(str(config), 'instance', 'console', uuid, *args,
                                  '--format', 'json')
            assert done.returncode == 0, done.stderr
            shown = json.loads(done.stdout)
            assert (shown['instance'], shown['node'], shown['console_enabled']) == (
                uuid, node, enabled), shown
            assert cluster.client.node.get_console(node)['console_enabled'] is enabled
        print(f'{uuid} on {node}: rescue, unrescue, console on and off')
        cluster.assert_consistent('after rescue and unrescue')

    def test_a_config_drive_reaches_ironic_and_a_rebuild_replaces_its_user_data(
            self, cluster, tmp_path):
        marker = f'MARKER-{random.randrange(10**9)}'
        files = {'key.pub': public_key() + '\n',
                 'user-data': f'#cloud-config\n# {marker} first\n',
                 'network.json': json.dumps(NETWORK),
                 'new-user-data': f'#!/bin/sh\necho {marker} second\n'}
        for name, text in files.items():
            (tmp_path / name).write_text(text)
        done, record = cluster.create(
            'cd-1', '--image', NEW_IMAGE, '--ssh-key', str(tmp_path / 'key.pub'),
            '--user-data', str(tmp_path / 'user-data'), '--meta', 'role=web',
            '--network-data', str(tmp_path / 'network.json'), '--hostname',
            'cd-1.example.com', '--wait', '--timeout', str(ACTION_TIMEOUT))
        assert done.returncode == 0 and record['vm_state'] == 'active', done.stderr
        uuid, node = record['uuid'], record['node']
        assert record['user_data']['size'] == len(files['user-data'])
        want = {'meta_data': {'uuid': uuid, 'name': 'cd-1',
                              'hostname': 'cd-1.example.com',
                              'public_keys': {'key-1': public_key()},
                              'meta': {'role': 'web'}},
                'user_data': files['user-data'], 'network_data': NETWORK}
        # Ironic's API masks it; its conductor stored what the deploy sent.
        assert cluster.node(node).instance_info['configdrive'] == '******'
        read = want if cluster.ironic.server is not None else None
        assert stored_configdrive(cluster.ironic, node) == read

        mark, updated = cluster.conductor.mark(), cluster.node(node).provision_updated_at
        done, record = cluster.act('rebuild', uuid, '--user-data',
                                   str(tmp_path / 'new-user-data'), '--wait',
                                   '--timeout', str(ACTION_TIMEOUT))
        assert_done(done, record, 'active', 'on')
        assert record['user_data']['size'] == len(files['new-user-data'])
        assert cluster.node(node).provision_updated_at != updated
        assert cluster.conductor.provision_states(node, mark) in (
            None, ['deploying', 'active'])
        want['user_data'] = files['new-user-data']
        stored = stored_configdrive(cluster.ironic, node)
        assert stored == (want if read else None)
        # The user data: in no daemon's log, no command's output.
        for text in [d.log() for d in cluster.daemons.values()] + [
                done.stdout, done.stderr]:
            assert marker not in text
        print(f'{uuid} on {node}: config drive '
              f'{"read from Ironic" if stored else "masked by Ironic"}, '
              'rebuilt with new user data')
        assert cluster.delete(uuid, '--wait', '--timeout',
                              str(ACTION_TIMEOUT)).returncode == 0
        cluster.assert_consistent('after the config drive')

    def test_actions_asked_while_the_host_is_dead_are_done_by_its_successor(
            self, cluster, tmp_path):
        # Six placed by the scheduler, two per host as it spreads them: the
        # host with the most has two to act on, and a third built on it to
        # rescue.
        cluster.with_active(2 * len(HOSTS))
        mine = collections.defaultdict(list)
        for instance in cluster.active_on(HOSTS):
            mine[instance.host].append(instance)
        victim_host = max(HOSTS, key=lambda h: (len(mine[h]), h))
        if len(mine[victim_host]) < 3:
            cluster._build([(victim_host, 1)])
            mine[victim_host] = [i for i in cluster.active_on([victim_host])]
        rebooted, stopped, rescued = mine[victim_host][:3]
        acted = (rebooted, stopped, rescued)
        password = f'rescue-{rescued.uuid[:8]}'
        secret = tmp_path / 'rescue-password'
        secret.write_text(password + '\n')
        survivors = tuple(h for h in HOSTS if h != victim_host)
        log = cluster.conductor
        mark = log.mark()
        changed = cluster.power_changed_at(rebooted.node)
        generations = {i.uuid: cluster.state(i.uuid).generation for i in acted}

        # Another test may have acted on one of them already: count from here.
        done_lines = {rebooted.uuid: f'Instance {rebooted.uuid}: rebooting done',
                      stopped.uuid: f'Instance {stopped.uuid}: powering-off done',
                      rescued.uuid: f'Instance {rescued.uuid}: rescuing done'}
        seen = {h: {line: d.count_in_log(line) for line in done_lines.values()}
                for h, d in cluster.daemons.items()}

        victim = cluster.daemons[victim_host]
        killed_at = time.monotonic()
        victim.kill()
        done, record = cluster.act('reboot', rebooted.uuid)
        assert done.returncode == 0 and record['task_state'] == 'rebooting', done.stderr
        done, record = cluster.act('stop', stopped.uuid)
        assert done.returncode == 0 and record['task_state'] == 'powering-off', done.stderr
        done, record = cluster.act('rescue', rescued.uuid, '--password-file', str(secret))
        assert done.returncode == 0 and record['task_state'] == 'rescuing', done.stderr
        # One task at a time: refused in one line naming the task in flight.
        refused, _ = cluster.act('stop', rebooted.uuid)
        assert refused.returncode == 1 and refused.stdout == '', refused
        assert refused.stderr.strip().splitlines() == [
            f'ironic-compute-manage: error: cannot stop instance {rebooted.uuid}: '
            'it has a task in flight: rebooting'], refused.stderr

        def waiting():
            _, shown = cluster.act('show', rebooted.uuid)
            assert shown['task_state'] == 'rebooting', f'done before it was seen waiting: {shown}'
            return shown['waiting']

        # Once the host is down (service_down_time), show says what the task waits for.
        why = daemons.wait_until(waiting, SERVICE_DOWN_TIME + 30, 0.5,
                                 'instance show to say the reboot waits for a takeover')
        assert why.startswith('for a takeover since ') and (
            f': its host {victim_host} is down (' in why), why
        assert cluster.power_changed_at(rebooted.node) == changed  # nothing sent yet

        def carried_out():
            cluster.check_daemons()
            states = {i.uuid: cluster.state(i.uuid) for i in acted}
            return states if all(s.task_state is None for s in states.values()) else None

        states = daemons.wait_until(carried_out, TAKEOVER_WAIT, 0.2,
                                    'the successors to carry the actions out')
        elapsed = time.monotonic() - killed_at
        # Not before the takeover: the kill came at most one heartbeat after the last one.
        assert elapsed >= SERVICE_DOWN_TIME + TAKEOVER_GRACE - REPORT_INTERVAL, elapsed
        # Fake hardware rescues with no ramdisk and no power change: still on.
        expected = {rebooted.uuid: ('active', 'on'), stopped.uuid: ('stopped', 'off'),
                    rescued.uuid: ('rescued', 'on')}
        for uuid, state in states.items():
            assert state.host in survivors, state
            assert (state.vm_state, state.power_state, state.fault) == (
                *expected[uuid], None), state
            assert state.generation > generations[uuid], state  # taken over: fenced anew
        assert cluster.node(rebooted.node).power_state == 'power on'
        assert cluster.node(stopped.node).power_state == 'power off'
        assert cluster.node(rescued.node).provision_state == 'rescue'
        assert cluster.power_changed_at(rebooted.node) != changed
        # Exactly once, by the host that took each over.
        for uuid, state in states.items():
            line = done_lines[uuid]
            logged = {h: d.count_in_log(line) - seen[h][line]
                      for h, d in cluster.daemons.items()}
            assert logged == {h: int(h == state.host) for h in HOSTS}, (line, logged)
        reboots = log.power_actions(rebooted.node, mark)
        offs = log.power_actions(stopped.node, mark)
        assert reboots in (None, [('power on', 'soft rebooting')]), reboots
        assert offs in (None, [('power off', 'soft power off')]), offs
        rescues = log.provision_states(rescued.node, mark)
        assert rescues in (None, ['rescuing', 'rescue']), rescues
        assert not any(password in d.log() for d in cluster.daemons.values())
        print(f'kill -9 {victim_host}: the reboot, the stop and the rescue asked after it '
              f'were done by {states[rebooted.uuid].host}, {states[stopped.uuid].host} and '
              f'{states[rescued.uuid].host} '
              f'{elapsed:.1f} s after the kill (service_down_time {SERVICE_DOWN_TIME} s + '
              f'grace {TAKEOVER_GRACE} s); conductor power actions: reboot {reboots}, '
              f'stop {offs}')
        cluster.assert_consistent('after the actions of the dead host')

    def test_a_node_powered_off_behind_our_back_is_recorded_stopped(self, cluster):
        cluster.with_active(1)
        instance = cluster.active_on(cluster.live_hosts())[0]
        uuid, node = instance.uuid, instance.node
        daemon = cluster.daemons[instance.host]
        line = f'Instance {uuid}: its node {node} is powered off; recorded stopped'
        mark, seen, off_at = cluster.power_behind_our_back(instance, 'off', line)

        def recorded():
            cluster.check_daemons()
            state = cluster.state(uuid)
            return state if state.vm_state == 'stopped' else None

        state = daemons.wait_until(recorded, SYNC_INTERVAL + 30, 0.1,
                                   f'{uuid} recorded stopped')
        elapsed = time.monotonic() - off_at
        print(f'powered off through Ironic: recorded stopped {elapsed:.1f} s later '
              f'(sync_power_state_interval {SYNC_INTERVAL} s)')
        assert elapsed <= SYNC_INTERVAL + SYNC_SLACK, elapsed
        assert (state.host, state.task_state, state.power_state, state.fault) == (
            instance.host, None, 'off', None), state
        assert daemon.count_in_log(line) == seen + 1
        # Recorded, not acted on: the only power action is ours.
        assert cluster.conductor.power_actions(node, mark) in (None, [('power off', 'power off')])
        assert cluster.node(node).power_state == 'power off'

    def test_a_stopped_instance_powered_on_behind_our_back_is_powered_off_again(
            self, cluster):
        cluster.with_stopped()
        instance = cluster.stopped_on(cluster.live_hosts())[0]
        uuid, node = instance.uuid, instance.node
        daemon = cluster.daemons[instance.host]
        line = (f'Instance {uuid}: stopped, but its node {node} is powered on; '
                'powering it off again')
        mark, seen, on_at = cluster.power_behind_our_back(instance, 'on', line)

        def off_again():
            cluster.check_daemons()
            state, ironic = cluster.state(uuid), cluster.node(node)
            return (state if ironic.power_state == 'power off' and state.task_state is None
                    and ironic.target_power_state is None else None)

        state = daemons.wait_until(off_again, SYNC_INTERVAL + ACTION_TIMEOUT, 0.1,
                                   f'the node of {uuid} powered off again')
        elapsed = time.monotonic() - on_at
        print(f'a stopped instance powered on through Ironic: powered off again '
              f'{elapsed:.1f} s later (sync_power_state_interval {SYNC_INTERVAL} s)')
        assert elapsed <= SYNC_INTERVAL + SYNC_SLACK + POWER_OFF_SLACK, elapsed
        assert (state.vm_state, state.power_state, state.fault) == ('stopped', 'off', None)
        assert daemon.count_in_log(line) == seen + 1
        assert cluster.conductor.power_actions(node, mark) in (
            None, [('power on', 'power on'), ('power off', 'soft power off')])
        # Settled: the next syncs leave the instances as they are.
        mark = cluster.conductor.mark()
        time.sleep(2 * SYNC_INTERVAL + 1)
        for other in cluster.instances().values():
            assert cluster.conductor.power_actions(other.node, mark) in (None, []), other
        assert cluster.state(uuid).vm_state == 'stopped'
        cluster.assert_consistent('after the power-state syncs')

    def test_a_reboot_whose_answer_is_lost_reaches_ironic_once(self, cluster):
        """Rule 1 of "Exactly once toward Ironic": the proxy between the service and
        Ironic forwards the reboot's PUT, and once Ironic has answered it, loses the
        answer: first a reset, then silence past the service's [ironic]timeout (a read
        timeout). Each time the service must not send the reboot again: it reads the
        node, finds the reboot taken, and waits for it to end."""
        cluster.with_active(1)
        instance = cluster.active_on(cluster.live_hosts())[0]
        uuid, node, host = instance.uuid, instance.node, instance.host
        proxy, daemon, log = cluster.proxies[host], cluster.daemons[host], cluster.conductor
        path = f'/v1/nodes/{node}/states/power'
        timeout = float(daemon.options['ironic']['timeout'])
        # calls.IronicCalls._change's lines: taken at once, or sent again.
        taken_line = (f'node.set_power_state {node}: the answer was lost, but Ironic '
                      'took the change')
        again_line = (f'node.set_power_state {node}: the answer was lost and Ironic did '
                      'not take')

        def the_reboot(method, target, body):
            return ((method, target) == ('PUT', path)
                    and 'reboot' in json.loads(body).get('target', ''))

        for how, hold in (('reset once Ironic answered', 0.0),
                          (f'held past [ironic]timeout {timeout:g} s', timeout + 2)):
            mark, api_mark = log.mark(), log.api_mark()
            changed = cluster.power_changed_at(node)
            sent, lost = proxy.count('PUT', path), len(proxy.lost)
            taken, again = daemon.count_in_log(taken_line), daemon.count_in_log(again_line)
            proxy.lose_answer(the_reboot, hold=hold)
            started = time.monotonic()
            done, record = cluster.act('reboot', uuid, '--wait', '--timeout', str(ACTION_TIMEOUT))
            elapsed = time.monotonic() - started
            assert_done(done, record, 'active', 'on')
            # Ironic answered the one PUT, and the service never saw that answer.
            assert proxy.lost[lost:] == [('PUT', path, 'HTTP/1.1 202 Accepted')], (
                how, proxy.lost)
            assert proxy.count('PUT', path) - sent == 1, how
            assert daemon.count_in_log(taken_line) == taken + 1, how
            assert daemon.count_in_log(again_line) == again, how
            state = cluster.node(node)
            assert (state.power_state, state.target_power_state) == ('power on', None), state
            assert state.driver_internal_info['last_power_state_change'] != changed
            # Once in Ironic's own logs: its API answered one PUT, its conductor
            # carried out one reboot.
            puts = log.api_requests('PUT', path, api_mark)
            reboots = log.power_actions(node, mark)
            assert puts is None or [status for status, _ in puts] == ['202'], (how, puts)
            assert reboots in (None, [('power on', 'soft rebooting')]), (how, reboots)
            print(f'reboot of {uuid} on {host}, answer lost ({how}): done in {elapsed:.1f} s; '
                  f'Ironic answered {puts}, carried out {reboots}')
        cluster.assert_consistent('after the reboots whose answers were lost')

    def test_the_power_sync_against_actions_in_a_loop(self, cluster):
        """Rule 3 of "Exactly once toward Ironic", with the sync every SYNC_INTERVAL s:
        for LOOP_SECONDS, one instance per host is stopped, started and rebooted in a
        loop (``instance ... --wait``), and every BEHIND_EVERY turns its node is
        powered behind the services' back first (off when it is active: the node wins,
        it is to end stopped unless an action is asked later; on when it is stopped:
        the database wins) and the next action asked at once, mostly a reboot, to race
        the sync (the issue's case: the tenant shuts the OS down, the operator
        reboots). Ironic answers each sync's listing SYNC_LISTING_DELAY s late, so
        that an action can run its course between a sync's listing and its writes.
        Every instance ends in the state last asked for, and Ironic agrees."""
        cluster.with_active_per_host(1)
        instances = {}
        for instance in cluster.active_on(HOSTS):
            instances.setdefault(instance.host, instance)
        instances = sorted(instances.values(), key=lambda i: i.host)
        assert len(instances) == len(HOSTS), instances
        seed = random.randrange(1 << 32)
        print(f'seed {seed}: {[(i.uuid, i.host) for i in instances]}')
        log = cluster.conductor
        mark = log.mark()
        # What the syncs did meanwhile (their log lines' ends), for the record.
        sync_lines = ('; recorded stopped', '; powering it off again')
        synced = {h: [d.count_in_log(line) for line in sync_lines]
                  for h, d in cluster.daemons.items()}
        for proxy in cluster.proxies.values():
            proxy.delay_answers(the_syncs_listing, SYNC_LISTING_DELAY)
        delayed = sum(p.delayed for p in cluster.proxies.values())
        end = time.monotonic() + LOOP_SECONDS
        outcomes = {}

        def behind_our_back(node, target):
            """Power ``node`` ``target`` through Ironic; once Ironic has done it."""
            before = cluster.node(node)
            if before.power_state == f'power {target}':
                return False
            changed = before.driver_internal_info.get('last_power_state_change')
            standalone.retry_locked(lambda: cluster.client.node.set_power_state(node, target))
            # Done: no power action in flight, and one began since (the sync may
            # already have powered a stopped instance's node off again).
            daemons.wait_until(
                lambda: (lambda n: n.target_power_state is None and n.driver_internal_info.get(
                    'last_power_state_change') != changed)(cluster.node(node)),
                ACTION_TIMEOUT, 0.05, f'node {node} powered {target} through Ironic')
            return True

        def quiet(instance, expected, seconds):
            """What went wrong while nothing was asked of ``instance`` for ``seconds``:
            its row must stay ``expected`` with no task, and Ironic must agree at the
            end. A sync whose listing began before the last action and whose write came
            after it would show here (the instance recorded stopped, then its node
            powered off again)."""
            wrong, samples, until = [], 0, time.monotonic() + seconds
            while time.monotonic() < until:
                state, samples = cluster.state(instance.uuid), samples + 1
                if (state.vm_state, state.task_state) != (expected, None):
                    wrong.append((round(time.monotonic() - end + LOOP_SECONDS, 1), state))
                time.sleep(0.1)
            node = cluster.node(instance.node)
            found = []
            if wrong:
                found.append(f'{expected} after the action, but {len(wrong)} of {samples} '
                             f'reads in the next {seconds} s differ, at {wrong[0][0]} s of '
                             f'the loop first: {wrong[0][1]}')
            if (node.power_state, node.target_power_state) != (POWER[expected], None):
                found.append(f'{expected} after the action, and {seconds} s later Ironic '
                             f'says {node.power_state} (target {node.target_power_state})')
            return found

        def loop(instance, rng):
            expected, counts, failures, turn = 'active', collections.Counter(), [], 0
            # Whether the instance's node was powered behind the services' back since
            # the last action asked: else nothing but this loop changes its row.
            behind = False
            try:
                while time.monotonic() < end:
                    row = cluster.state(instance.uuid)
                    if not behind and (row.vm_state, row.task_state) != (expected, None):
                        failures.append(('changed behind the loop', expected, row))
                    if row.task_state is not None:  # the sync powers it off again
                        time.sleep(0.2)
                        continue
                    turn += 1
                    if turn % BEHIND_EVERY == 0:
                        target = 'off' if row.vm_state == 'active' else 'on'
                        if behind_our_back(instance.node, target):
                            counts[f'powered {target} behind'] += 1
                            behind = True
                            if target == 'off':
                                expected = 'stopped'
                    action = rng.choice(('stop', 'reboot', 'reboot')
                                        if row.vm_state == 'active' else ('start', 'reboot'))
                    done, record = cluster.act(action, instance.uuid, '--wait', '--timeout',
                                               str(ACTION_TIMEOUT))
                    if done.returncode == 0:
                        expected = DONE[action]
                        counts[action] += 1
                        if behind:
                            # The race: a sync pass may have begun before the action.
                            behind = False
                            failures += quiet(instance, expected, QUIET)
                    elif behind and not done.stdout.strip() and (
                            f'cannot {action} instance {instance.uuid}: ' in done.stderr):
                        counts[f'{action} refused'] += 1  # the sync was first
                    else:
                        failures.append((action, done.returncode, done.stderr.strip()[-500:],
                                         record))
            except Exception as exc:  # noqa: BLE001 - reported by the test
                failures.append(('loop', repr(exc)))
            outcomes[instance.uuid] = (expected, counts, failures)

        threads = [threading.Thread(target=loop, args=(i, random.Random(seed + n)), daemon=True)
                   for n, i in enumerate(instances)]
        for thread in threads:
            thread.start()
        for thread in threads:
            # A turn ends within its command's --timeout (and the CLI's own start).
            thread.join(LOOP_SECONDS + ACTION_TIMEOUT + 60)
        assert not any(t.is_alive() for t in threads), 'a loop did not end'
        for proxy in cluster.proxies.values():
            proxy.clear()
        delayed = sum(p.delayed for p in cluster.proxies.values()) - delayed
        # Each service's sync ran about every SYNC_INTERVAL + SYNC_LISTING_DELAY s.
        assert delayed >= len(HOSTS) * LOOP_SECONDS / (2 * (SYNC_INTERVAL + SYNC_LISTING_DELAY)), (
            delayed)
        for uuid, (last, counts, _) in outcomes.items():
            print(f'{uuid}: {dict(counts)}, last asked: {last}')
        failures = {uuid: failed for uuid, (_, _, failed) in outcomes.items() if failed}
        assert not failures, failures

        expected = {uuid: outcome[0] for uuid, outcome in outcomes.items()}
        wanted_power = {state: (power.split()[1], power) for state, power in POWER.items()}
        by_uuid = {i.uuid: i for i in instances}

        def agreed():
            cluster.check_daemons()
            for uuid, vm_state in expected.items():
                state, node = cluster.state(uuid), cluster.node(by_uuid[uuid].node)
                if (state.vm_state, state.task_state, state.power_state, state.fault,
                        node.power_state, node.target_power_state) != (
                        vm_state, None, wanted_power[vm_state][0], None,
                        wanted_power[vm_state][1], None):
                    return None
            return True

        # The last change behind our back is recorded by the next sync, or undone by
        # the sync's power off (a soft one, polled).
        started = time.monotonic()
        daemons.wait_until(agreed, 2 * SYNC_INTERVAL + ACTION_TIMEOUT, 0.2,
                           f'the instances {expected} and their nodes to agree')
        print(f'settled {time.monotonic() - started:.1f} s after the loop')
        # And they stay so: the next syncs leave them as they are.
        mark_after = log.mark()
        time.sleep(2 * SYNC_INTERVAL + 1)
        assert agreed(), {u: (cluster.state(u), cluster.node(by_uuid[u].node).power_state)
                          for u in expected}
        for instance in instances:
            assert log.power_actions(instance.node, mark_after) in (None, []), instance
        # Every reboot asked reached Ironic once.
        for instance in instances:
            reboots = log.power_actions(instance.node, mark)
            if reboots is not None:
                reboots = [a for t, a in reboots if a in ('soft rebooting', 'rebooting')]
                assert len(reboots) == outcomes[instance.uuid][1]['reboot'], (instance, reboots)
        synced = {h: [d.count_in_log(line) - synced[h][n] for n, line in enumerate(sync_lines)]
                  for h, d in cluster.daemons.items()}
        print(f'the syncs meanwhile, per host [recorded stopped, powered off again]: {synced}; '
              f'{delayed} sync listings answered {SYNC_LISTING_DELAY} s late')
        cluster.assert_consistent('after the loop of actions against the sync')
