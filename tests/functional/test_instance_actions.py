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
power-state sync every SYNC_INTERVAL seconds. Actions are asked for with
``ironic-compute-manage instance stop|start|reboot|rebuild``, as an operator would.
Ironic's side is read with ironicclient and, to count what its conductor did, from the
conductor's log: it logs one "Successfully set node N power state to S by A" line per
power action it carries out (none when the node is in the state asked already) and one
"Node N moved to provision state" line per provision state change. With ``IRONIC_URL``
(an Ironic the session did not start, whose log it cannot read) those counts are skipped
and "once" rests on the services' logs and the node's ``last_power_state_change``. The
tests of the class share one cluster; each builds the instances it needs first, so any
one of them runs alone.
"""

import collections
import json
import os
import re
import time

import sqlalchemy as sa

from ironic_compute.harness import ironic as standalone
from tests.functional import daemons
from tests.functional import test_instances

HOSTS = test_instances.HOSTS
GROUP = test_instances.GROUP
SERVICE_DOWN_TIME = test_instances.SERVICE_DOWN_TIME
# Longer than test_instances' grace: between the host being seen down and the
# takeover, `instance show` (a CLI process: a second on a quiet machine, up to
# ten on a loaded one, seen on CI) must catch the task waiting.
TAKEOVER_GRACE = 20
REPORT_INTERVAL = test_instances.REPORT_INTERVAL
SYNC_INTERVAL = 3  # [DEFAULT]sync_power_state_interval
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

_instances = sa.table('instances', sa.column('uuid'), sa.column('host'),
                      sa.column('vm_state'), sa.column('task_state'),
                      sa.column('power_state'), sa.column('generation'),
                      sa.column('fault'), sa.column('deleted'))

State = collections.namedtuple('State', 'host vm_state task_state power_state generation fault')

_POWER_LINE = re.compile(
    r'Successfully set node (?P<node>[0-9a-f-]{36}) power state to (?P<target>[a-z ]+) '
    r'by (?P<action>[a-z ]+)\.')
_PROVISION_LINE = re.compile(
    r'Node (?P<node>[0-9a-f-]{36}) moved to provision state "(?P<state>[^"]*)" '
    r'from state "(?P<previous>[^"]*)"')


class ConductorLog:
    """What the conductor of GROUP did, from its log (a managed Ironic only)."""

    def __init__(self, ironic):
        self.path = None
        if ironic.managed:
            self.path = ironic.server.log_path(standalone.process_name(GROUP))

    def mark(self):
        """Where the log ends now: read what comes after with the methods below."""
        return os.path.getsize(self.path) if self.path else 0

    def _lines(self, since, pattern, node):
        if self.path is None:
            return None
        with open(self.path, 'rb') as f:
            f.seek(since)
            text = f.read().decode(errors='replace')
        return [m for m in pattern.finditer(text) if m['node'] == node]

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

    node_count = 9

    def __init__(self, backend, workdir, ironic):
        super().__init__(backend, workdir, ironic)
        self.conductor = ConductorLog(ironic)

    def _options(self, host, *urls):
        options = super()._options(host, *urls)
        options['DEFAULT'].update(sync_power_state_interval=SYNC_INTERVAL,
                                  instance_takeover_grace=TAKEOVER_GRACE)
        return options

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

    def test_actions_asked_while_the_host_is_dead_are_done_by_its_successor(
            self, cluster):
        # Six placed by the scheduler, two per host as it spreads them: the
        # host with the most has two to act on.
        cluster.with_active(2 * len(HOSTS))
        mine = collections.defaultdict(list)
        for instance in cluster.active_on(HOSTS):
            mine[instance.host].append(instance)
        victim_host = max(HOSTS, key=lambda h: (len(mine[h]), h))
        rebooted, stopped = mine[victim_host][:2]
        survivors = tuple(h for h in HOSTS if h != victim_host)
        log = cluster.conductor
        mark = log.mark()
        changed = cluster.power_changed_at(rebooted.node)
        generations = {i.uuid: cluster.state(i.uuid).generation for i in (rebooted, stopped)}

        # Another test may have acted on one of them already: count from here.
        done_lines = {rebooted.uuid: f'Instance {rebooted.uuid}: rebooting done',
                      stopped.uuid: f'Instance {stopped.uuid}: powering-off done'}
        seen = {h: {line: d.count_in_log(line) for line in done_lines.values()}
                for h, d in cluster.daemons.items()}

        victim = cluster.daemons[victim_host]
        killed_at = time.monotonic()
        victim.kill()
        done, record = cluster.act('reboot', rebooted.uuid)
        assert done.returncode == 0 and record['task_state'] == 'rebooting', done.stderr
        done, record = cluster.act('stop', stopped.uuid)
        assert done.returncode == 0 and record['task_state'] == 'powering-off', done.stderr
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
            states = {i.uuid: cluster.state(i.uuid) for i in (rebooted, stopped)}
            return states if all(s.task_state is None for s in states.values()) else None

        states = daemons.wait_until(carried_out, TAKEOVER_WAIT, 0.2,
                                    'the successors to carry both actions out')
        elapsed = time.monotonic() - killed_at
        # Not before the takeover: the kill came at most one heartbeat after the last one.
        assert elapsed >= SERVICE_DOWN_TIME + TAKEOVER_GRACE - REPORT_INTERVAL, elapsed
        expected = {rebooted.uuid: ('active', 'on'), stopped.uuid: ('stopped', 'off')}
        for uuid, state in states.items():
            assert state.host in survivors, state
            assert (state.vm_state, state.power_state, state.fault) == (
                *expected[uuid], None), state
            assert state.generation > generations[uuid], state  # taken over: fenced anew
        assert cluster.node(rebooted.node).power_state == 'power on'
        assert cluster.node(stopped.node).power_state == 'power off'
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
        print(f'kill -9 {victim_host}: the reboot and the stop asked after it were done by '
              f'{states[rebooted.uuid].host} and {states[stopped.uuid].host} '
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
