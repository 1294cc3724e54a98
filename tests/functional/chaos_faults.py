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

"""The faults of the chaos soak: one function each, ``fault(soak)``.

Each fault begins (``soak.begin``), does its harm, ends it, and then waits
for the nodes to converge (``soak.after`` or ``soak.converge``). FAULTS
maps the kinds (chaos.KINDS) to them; a fault that cannot run now (no
instance to remove) runs its counterpart instead.
"""

import json
import signal
import time
import uuid as uuidlib

from tests.functional import daemons
from tests.functional import ironic_env
from tests.functional.chaos import BOUND
from tests.functional.chaos import BUILD_WAIT
from tests.functional.chaos import GROUPS
from tests.functional.chaos import HOSTS
from tests.functional.chaos import MAX_INSTANCES
from tests.functional.chaos import OVERTIME
from tests.functional.chaos import SERVICE_DOWN_TIME
from tests.functional.chaos import STOP_BOUND
from tests.functional.chaos import TAKEOVER_BOUND


def start_and_wait(soak, daemon, label):
    """Start a stopped daemon and wait for its first heartbeat, so that the
    next fault does not find it still starting (a database cut then fails
    its start-up: exit 1, by design); the monotonic time of that
    heartbeat's sample, or None (a failure, reported)."""
    before = soak.sampler.last_heartbeat(daemon.host)
    daemon.start()
    started = time.monotonic()
    try:
        daemons.wait_until(
            lambda: soak.sampler.first(
                lambda _o, _u, beats: beats.get(daemon.host) not in (None, before),
                started), 60, message=f'{daemon.host} heartbeating after its restart')
    except AssertionError as exc:
        soak.fail(f'{label}: {exc}')
        return None
    registered, _ = soak.sampler.first(
        lambda _o, _u, beats: beats.get(daemon.host) not in (None, before), started)
    print(f'  {daemon.host} heartbeated {registered - started:.1f} s after the start',
          flush=True)
    return registered


def restart(soak, daemon, label, bound):
    """Start a stopped daemon; converge from its first heartbeat."""
    registered = start_and_wait(soak, daemon, label)
    if registered is not None:
        soak.after(label, registered, bound)


def kill9(soak):
    daemon = soak.daemons[soak.rng.choice(HOSTS)]
    failover = soak.rng.random() < 0.5
    soak.begin(f'kill -9 {daemon.host}' + (' (until failover)' if failover else ''))
    daemon.kill()
    killed = time.monotonic()
    if failover:
        soak.converge('kill -9: failover', killed, BOUND, down=(daemon.host,))
        soak.sleep(soak.rng.uniform(0, 2))
    else:
        soak.sleep(soak.rng.uniform(1, 5))
    restart(soak, daemon, 'kill -9: restart', BOUND)


def sigterm(soak):
    daemon = soak.daemons[soak.rng.choice(HOSTS)]
    soak.begin(f'SIGTERM {daemon.host}')
    daemon.signal(signal.SIGTERM)
    try:
        code = daemon.process.wait(30)
    except Exception:  # noqa: BLE001 - reported, then killed
        code = 'no exit within 30 s'
        daemon.kill()
    if code != 0:
        soak.fail(f'{daemon.host} exited with {code} after SIGTERM')
    soak.converge('SIGTERM: handover', time.monotonic(), STOP_BOUND,
                  down=(daemon.host,))
    soak.sleep(soak.rng.uniform(0, 3))
    restart(soak, daemon, 'SIGTERM: restart', STOP_BOUND)


def sigstop(soak):
    daemon = soak.daemons[soak.rng.choice(HOSTS)]
    pause = soak.rng.uniform(SERVICE_DOWN_TIME + 1, SERVICE_DOWN_TIME + 6)
    soak.begin(f'SIGSTOP {daemon.host} for {pause:.1f} s')
    daemon.pause()
    try:
        soak.sleep(pause)
    finally:
        daemon.resume()
    soak.after('SIGSTOP, SIGCONT', time.monotonic())


def sighup(soak):
    daemon = soak.daemons[soak.rng.choice(HOSTS)]
    variant = soak.rng.choice(('good', 'unparsable file', 'invalid value'))
    soak.begin(f'SIGHUP {daemon.host} ({variant})')
    if variant == 'good':
        options = daemon.options['DEFAULT']
        options['debug'] = 'true' if options['debug'] == 'false' else 'false'
        daemon.write_config()
        expected = 'Configuration applied'
    elif variant == 'unparsable file':
        daemon.write_config('[ironic\npartition_key = group-a\n')
        expected = 'Configuration files not reloaded'
    else:
        bad = {s: dict(v) for s, v in daemon.options.items()}
        bad['ironic']['partition_key'] = 'not a group!'
        daemon.write_config(daemons.config_text(bad))
        expected = 'New configuration not applied'
    seen = daemon.count_in_log(expected)
    daemon.signal(signal.SIGHUP)
    sent = time.monotonic()
    try:
        daemons.wait_until(lambda: daemon.count_in_log(expected) > seen, 15,
                           message=f'"{expected}" in the log of {daemon.host}')
    except AssertionError as exc:
        soak.fail(str(exc))
    finally:
        daemon.write_config()  # what a restart reads
    soak.after(f'SIGHUP ({variant})', sent)


def _cut(soak, what, proxies):
    scope = soak.rng.choice(('one', 'all'))
    hosts = HOSTS if scope == 'all' else (soak.rng.choice(HOSTS),)
    seconds = soak.rng.uniform(3, 15)
    soak.begin(f'{what} cut for {seconds:.1f} s: '
               + ('all' if scope == 'all' else hosts[0]))
    for host in hosts:
        proxies[host].down()
    try:
        soak.sleep(seconds)
    finally:
        for host in hosts:
            proxies[host].up()
    soak.after(f'{what} cut ({scope})', time.monotonic())


def db_cut(soak):
    _cut(soak, 'DB', soak.db_proxies)


def ironic_cut(soak):
    _cut(soak, 'Ironic', soak.ironic_proxies)


def group_change(soak):
    node = soak.rng.choice(soak.unpinned_nodes())
    new = 'group-b' if soak.group_of[node] == 'group-a' else 'group-a'
    soak.begin(f'node {node} to {new}')
    ironic_env.retry_locked(lambda: soak.client.node.update(
        node, [{'op': 'replace', 'path': '/conductor_group', 'value': new}]))
    soak.group_of[node] = new
    soak.after('group change', time.monotonic())


def node_recreated(soak):
    node = soak.rng.choice(soak.unpinned_nodes())
    group = soak.group_of[node]
    soak.begin(f'node {node} deleted and re-created')
    # The one row the soak means to lose: its node is gone from Ironic.
    soak.sampler.expect_gone([node])
    ironic_env.retry_locked(lambda: soak.client.node.delete(node))
    del soak.group_of[node]
    try:
        daemons.wait_until(lambda: node not in soak.sampler.fresh_snapshot(),
                           BOUND + OVERTIME, message=f'the row of {node} soft-deleted')
    except AssertionError as exc:
        soak.fail(str(exc))
    soak.sleep(soak.rng.uniform(0, 3))
    ironic_env.create_nodes(soak.client, 1, group, name_prefix=None, uuid=node)
    soak.recreated.add(node)
    soak.sampler.expect_back([node])
    soak.group_of[node] = group
    soak.after('node re-created', time.monotonic())


def instance_add(soak):
    if len(soak.instances) >= MAX_INSTANCES:
        return instance_remove(soak)
    node = soak.rng.choice(soak.unpinned_nodes())
    host = soak.rng.choice(GROUPS[soak.group_of[node]])
    instance = str(uuidlib.uuid4())
    soak.begin(f'instance {instance} added on {node}, host {host}')
    result = soak.manage('instance', 'add', instance, '--host', host, '--node', node)
    if result.returncode:
        soak.fail(f'instance add: {result.stdout}{result.stderr}')
        return
    soak.instances[instance] = (host, node)
    soak.after('instance add', time.monotonic())


def instance_remove(soak):
    if not soak.instances:
        return instance_add(soak)
    instance = soak.rng.choice(sorted(soak.instances))
    soak.begin(f'instance {instance} removed')
    soak.sampler.expect_instances_gone([instance])
    result = soak.manage('instance', 'remove', instance)
    if result.returncode:
        soak.fail(f'instance remove: {result.stdout}{result.stderr}')
        return
    del soak.instances[instance]
    soak.after('instance remove', time.monotonic())


def instance_build(soak):
    if len(soak.built) >= MAX_INSTANCES:
        return instance_delete(soak)
    group = soak.rng.choice(sorted(GROUPS))
    name = f'chaos-{len(soak.timeline)}'
    soak.begin(f'instance {name} built in {group}')
    result = soak.manage('instance', 'create', '--name', name, '--resource-class',
                         ironic_env.DEFAULT_RESOURCE_CLASS, '--partition-key', group,
                         '--format', 'json', '--wait', '--timeout', str(BUILD_WAIT))
    record = json.loads(result.stdout) if result.stdout.strip() else None
    if record is None:
        # Refused: no live service of the group holds a free node (the
        # buildable ones are taken, moved or re-created). Not a fault.
        print(f'  not built: {result.stderr.strip()}', flush=True)
        return
    if record['vm_state'] != 'active':
        soak.fail(f'instance build: {record["vm_state"]}/{record["task_state"]}: '
                  f'{record["fault"]}')
        return
    soak.built[record['uuid']] = (record['host'], record['node'])
    soak.after('instance build', time.monotonic())


def instance_delete(soak):
    if not soak.built:
        return instance_build(soak)
    instance = soak.rng.choice(sorted(soak.built))
    soak.begin(f'instance {instance} deleted')
    soak.sampler.expect_instances_gone([instance])
    result = soak.manage('instance', 'delete', instance, '--format', 'json', '--wait',
                         '--timeout', str(BUILD_WAIT))
    if result.returncode:
        soak.fail(f'instance delete: {result.stdout}{result.stderr}')
        return
    del soak.built[instance]
    soak.after('instance delete', time.monotonic())


def instance_action(soak):
    """A stop, start, reboot or rebuild of a built instance, whatever
    the faults do to its host meanwhile: the agreement checks decide."""
    if not soak.built:
        return instance_build(soak)
    instance = soak.rng.choice(sorted(soak.built))
    shown = soak.manage('instance', 'show', instance, '--format', 'json')
    state = json.loads(shown.stdout)['vm_state'] if shown.returncode == 0 else None
    choices = {'active': ('stop', 'reboot', 'rebuild'),
               'stopped': ('start', 'reboot')}.get(state)
    if not choices:
        return
    action = soak.rng.choice(choices)
    extra = ('--image', 'http://chaos.example/rebuilt.img') if action == 'rebuild' else ()
    soak.begin(f'instance {instance} {action}')
    result = soak.manage('instance', action, instance, *extra, '--format', 'json',
                         '--wait', '--timeout', str(BUILD_WAIT))
    # Refused (a task in flight), or still waiting for a host that is
    # down: not a fault. A fault on the instance is printed; the
    # agreement of the database with Ironic is checked at every sample.
    print(f'  {action}: exit {result.returncode} '
          f'{(result.stderr or result.stdout).strip()[-200:]}', flush=True)
    soak.after('instance action', time.monotonic())


def instance_takeover(soak):
    """A host with a built instance frozen (SIGSTOP) or killed past the
    takeover grace, an action queued for the instance meanwhile: a live
    peer takes the instance over and carries the action out, and the
    frozen host, resumed with its stale workers, must not act (the
    agreement with Ironic is checked at every sample)."""
    if not soak.built:
        instance_build(soak)
        if not soak.built:
            return
    instance = soak.rng.choice(sorted(soak.built))
    host = soak.built[instance][0]
    daemon = soak.daemons[host]
    variant = soak.rng.choice(('SIGSTOP', 'kill -9'))
    shown = soak.manage('instance', 'show', instance, '--format', 'json')
    state = json.loads(shown.stdout)['vm_state'] if shown.returncode == 0 else None
    action = {'active': 'reboot', 'stopped': 'start'}.get(state)
    soak.begin(f'instance {instance} taken over from {host} ({variant}), '
               f'{action or "no action"} asked meanwhile')
    if variant == 'SIGSTOP':
        daemon.pause()
    else:
        daemon.kill()
    try:
        if action:
            queued = soak.manage('instance', action, instance, '--format', 'json')
            print(f'  {action} queued: exit {queued.returncode} '
                  f'{queued.stderr.strip()[-200:]}', flush=True)
        daemons.wait_until(
            lambda: all(i[0] != host for i in soak.sampler.instances().values()),
            TAKEOVER_BOUND + OVERTIME, 0.5, f'the instances of {host} taken over')
        daemons.wait_until(
            lambda: soak.sampler.instances().get(instance, (None,) * 4)[3] is None,
            BUILD_WAIT, 0.5, f'the {action} of {instance} carried out by its successor')
        print(f'  taken over by {soak.sampler.instances()[instance][0]}', flush=True)
    except AssertionError as exc:
        soak.fail(f'instance takeover: {exc}')
    finally:
        if variant == 'SIGSTOP':
            daemon.resume()
        else:
            start_and_wait(soak, daemon, 'instance takeover')
    soak.after('instance takeover', time.monotonic())


FAULTS = {
    'kill -9': kill9, 'SIGTERM': sigterm, 'SIGSTOP': sigstop, 'SIGHUP': sighup,
    'DB cut': db_cut, 'Ironic cut': ironic_cut, 'group change': group_change,
    'node re-created': node_recreated, 'instance add': instance_add,
    'instance remove': instance_remove, 'instance build': instance_build,
    'instance delete': instance_delete, 'instance action': instance_action,
    'instance takeover': instance_takeover,
}
