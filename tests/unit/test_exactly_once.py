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

"""Exactly once toward Ironic (doc/instances.md, "Exactly once"), on
SQLite, MariaDB and PostgreSQL against the fake Ironic, behind the real
adapter where its retries matter:

1. a change is never sent again after Ironic may have received it;
2. an action is done only from a read that began after its call was
   answered;
3. the power-state sync writes only on the row version it read.
"""

import threading
import time

import pytest
import requests
from keystoneauth1 import exceptions as ks_exc
from urllib3 import exceptions as urllib3_exc

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import model as inst
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import ctx
from tests.unit.test_instance_actions import ask
from tests.unit.test_instance_actions import carry_out


def _raised(error, context):
    """``error`` as raised while handling ``context`` (its __context__), as
    keystoneauth raises its errors from requests' ones."""
    try:
        try:
            raise context
        except BaseException:
            raise error  # noqa: B904 (the context is the point)
    except BaseException as raised:
        return raised


def read_timeout():
    """keystoneauth's error for a read timeout: the request went out."""
    return _raised(ks_exc.ConnectTimeout('Request to ironic timed out'),
                   requests.exceptions.ReadTimeout('read timed out'))


def reset_after_sending():
    return _raised(ks_exc.ConnectFailure('Unable to establish connection'),
                   requests.exceptions.ConnectionError(
                       urllib3_exc.ProtocolError(
                           'Connection aborted.',
                           ConnectionResetError(104, 'reset by peer'))))


def refused():
    reason = urllib3_exc.NewConnectionError(None, 'Connection refused')
    return _raised(ks_exc.ConnectFailure('Unable to establish connection'),
                   requests.exceptions.ConnectionError(
                       urllib3_exc.MaxRetryError(None, '/v1/nodes', reason)))


def connect_timeout():
    return _raised(ks_exc.ConnectTimeout('Request to ironic timed out'),
                   requests.exceptions.ConnectTimeout('connect timed out'))


# --- which failures may have reached Ironic -----------------------------------

@pytest.mark.parametrize('error, sent', [
    (read_timeout(), False), (reset_after_sending(), False),
    (refused(), True), (connect_timeout(), True),
    (ks_exc.ConnectFailure('no cause known'), False)])
def test_never_sent_only_for_a_connection_never_opened(error, sent):
    assert ironic.never_sent(error) is sent


class Lossy:
    """ironicclient over the fake Ironic, losing the answer of the calls
    named in ``lose`` (``taken``: Ironic carried the call out first, as
    after a read timeout; else it never got it). Counts attempts."""

    def __init__(self, fake, lose, error=read_timeout, taken=True, times=1):
        self.fake, self.lose, self.error = fake, lose, error
        self.taken, self.times = taken, times
        self.attempts = []
        self.node = ClientManager(self, 'node')
        self.allocation = ClientManager(self, 'allocation')

    def call(self, name, *args, **kwargs):
        self.attempts.append(name)
        func = getattr(self.fake, name.replace('.', '_'))
        if name in self.lose and self.times > 0:
            self.times -= 1
            if self.taken:
                func(*args, **kwargs)
            raise self.error()
        return func(*args, **kwargs)


class ClientManager:
    """ironicclient's ``node`` or ``allocation`` manager over a test client:
    each method call goes to ``client.call('prefix.method', ...)``."""

    def __init__(self, lossy, prefix):
        self._lossy, self._prefix = lossy, prefix

    def __getattr__(self, name):
        return lambda *args, **kwargs: self._lossy.call(
            f'{self._prefix}.{name}', *args, **kwargs)


def behind_the_adapter(cloud, host='a', **lossy):
    """The host's workers talk to the fake through the real adapter (its
    retries, at once) over a Lossy client; the Lossy."""
    cloud.conf.set_override('api_retry_interval', 0, group='ironic')
    client = Lossy(cloud.ironic, **lossy)
    provisioner = cloud.managers[host].provisioner
    provisioner._ironic = ironic.IronicClient(cloud.conf, client=client)
    provisioner.lost_answer_settle = 0.2
    return client


def test_the_adapter_retries_a_read_but_not_a_change_after_a_lost_answer(
        cloud):
    client = Lossy(cloud.ironic, lose={'node.get', 'node.set_power_state'})
    cloud.conf.set_override('api_retry_interval', 0, group='ironic')
    adapter = ironic.IronicClient(cloud.conf, client=client)
    node = cloud.node()
    assert adapter.request('node.get', node).uuid == node
    assert client.attempts == ['node.get'] * 2
    client.times = 1
    with pytest.raises(exception.MaybeSent):
        adapter.request('node.set_power_state', node, 'on')
    assert client.attempts[2:] == ['node.set_power_state']


def test_the_adapter_retries_a_change_that_never_left(cloud):
    client = Lossy(cloud.ironic, lose={'node.set_power_state'},
                   error=refused, taken=False, times=2)
    cloud.conf.set_override('api_retry_interval', 0, group='ironic')
    adapter = ironic.IronicClient(cloud.conf, client=client)
    adapter.request('node.set_power_state', cloud.node(), 'off')
    assert client.attempts == ['node.set_power_state'] * 3
    assert cloud.ironic.power_calls == [(cloud.node(), 'off', False)]


# --- rule 1: a lost answer is read, not re-sent -------------------------------

def sent_calls(cloud, node, action):
    """The calls of ``action`` that reached the fake Ironic for ``node``."""
    if action == 'rebuild':
        return [c for c in cloud.ironic.provision_calls
                if c == (node, 'rebuild')]
    target = {'reboot': 'reboot', 'stop': 'off'}[action]
    return [c for c in cloud.ironic.power_calls
            if c[0] == node and c[1] == target]


ACTION_CALLS = {'reboot': 'node.set_power_state',
                'stop': 'node.set_power_state',
                'rebuild': 'node.set_provision_state'}


@pytest.mark.parametrize('error', [read_timeout, reset_after_sending])
@pytest.mark.parametrize('action', ['reboot', 'rebuild', 'stop'])
def test_a_lost_answer_is_not_followed_by_a_second_call(cloud, action,
                                                        error):
    row = built(cloud)
    client = behind_the_adapter(cloud, lose={ACTION_CALLS[action]},
                                error=error)
    ask(row, action, **({'image': 'http://img2'} if action == 'rebuild'
                        else {}))
    done = carry_out(cloud, row)
    assert len(sent_calls(cloud, row.node, action)) == 1
    assert client.attempts.count(ACTION_CALLS[action]) == 1
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.STOPPED if action == 'stop' else inst.ACTIVE, None, None)


@pytest.mark.parametrize('action', ['reboot', 'rebuild', 'stop'])
def test_a_change_ironic_never_took_is_sent_again_once(cloud, action):
    row = built(cloud)
    client = behind_the_adapter(cloud, lose={ACTION_CALLS[action]},
                                error=reset_after_sending, taken=False)
    ask(row, action, **({'image': 'http://img2'} if action == 'rebuild'
                        else {}))
    done = carry_out(cloud, row)
    assert len(sent_calls(cloud, row.node, action)) == 1
    assert client.attempts.count(ACTION_CALLS[action]) == 2
    assert (done.task_state, done.fault) == (None, None)


def test_a_lost_answer_with_ironic_unreadable_sends_nothing_more(cloud):
    row = built(cloud)
    client = behind_the_adapter(cloud, lose={'node.set_power_state'})
    ask(row, 'reboot', hard=True)
    original = cloud.ironic.node_set_power_state

    def then_unreachable(*args, **kwargs):
        original(*args, **kwargs)
        cloud.ironic.unavailable_reads = True
    cloud.ironic.node_set_power_state = then_unreachable
    reads = cloud.ironic.node_get

    def failing_read(uuid, fields=None):
        if getattr(cloud.ironic, 'unavailable_reads', False):
            raise requests.exceptions.ConnectionError('refused')
        return reads(uuid, fields)
    cloud.ironic.node_get = failing_read
    paused = carry_out(cloud, row)
    assert paused.task_state == inst.REBOOTING  # left for a later attempt
    assert client.attempts.count('node.set_power_state') == 1
    # Ironic answers again: the resumed reboot sees it was carried out.
    cloud.ironic.unavailable_reads = False
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state) == (inst.ACTIVE, None)
    assert len(sent_calls(cloud, row.node, 'reboot')) == 1


# --- rule 2: done only from a read that began after the call ------------------

class StaleListing:
    """The first shared listing of the polls, once armed, reads the nodes
    at once but answers only after ``release`` is set (and a moment more):
    a listing in flight, begun before the call a poll then waits on."""

    def __init__(self, fake):
        self.fake = fake
        self.release = threading.Event()
        self.armed = True
        self._list = fake.node_list
        fake.node_list = self

    def __call__(self, *args, **kwargs):
        states = self._list(*args, **kwargs)
        if self.armed:
            self.armed = False
            self.release.wait(10)
            time.sleep(0.3)  # the waiter's first poll joins it meanwhile
        return states


def _in_flight_listing(cloud, host='a'):
    """Start a shared listing of the polls of ``host`` (two other nodes are
    watched, so the polls share one); the watches, which must be kept (a
    watch ends when it is garbage-collected)."""
    provisioner = cloud.managers[host].provisioner
    watches = [provisioner.watching(f'other-{i}') for i in range(2)]
    for watch in watches:
        watch.__enter__()
    threading.Thread(target=provisioner.polled_node, args=('other-0',),
                     daemon=True).start()
    return watches


def _release_when(cloud, listing, sent):
    """Let the stale listing answer once ``sent()`` says the call went."""
    def watch():
        deadline = time.monotonic() + 10
        while not sent() and time.monotonic() < deadline:
            time.sleep(0.005)
        listing.release.set()
    threading.Thread(target=watch, daemon=True).start()


def _in_thread(func, *args):
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault('value', func(*args)), daemon=True)
    thread.start()
    return thread, result


def test_a_rebuild_is_not_done_on_a_listing_begun_before_it(cloud):
    row = built(cloud)
    ask(row, 'rebuild', image='http://img2')
    cloud.ironic.deploy_hangs = True  # deploying until the test ends it
    listing = StaleListing(cloud.ironic)
    watches = _in_flight_listing(cloud)  # noqa: F841 (kept while it runs)
    _release_when(cloud, listing, lambda: (row.node, 'rebuild')
                  in cloud.ironic.provision_calls)
    worker, result = _in_thread(carry_out, cloud, row)
    time.sleep(0.8)
    # The listing said "active, no target", the node's state before the
    # rebuild: the rebuild is still in flight, and still waited on.
    assert worker.is_alive()
    assert db_instances.get(ctx(), row.uuid).task_state == inst.REBUILDING
    # The rebuild fails in Ironic: recorded as failed.
    cloud.ironic.targets.pop(row.node)
    cloud.ironic.set_node(row.node, provision_state='deploy failed')
    worker.join(10)
    failed = result['value']
    assert failed.task_state is None
    assert 'rebuild' in failed.fault and 'deploy failed' in failed.fault


def test_a_soft_reboot_seen_on_an_older_listing_still_falls_back_to_hard(
        cloud):
    row = built(cloud)
    cloud.ironic.soft_power_ignored = True  # the OS never shuts down
    ask(row, 'reboot', hard=False)
    listing = StaleListing(cloud.ironic)
    watches = _in_flight_listing(cloud)  # noqa: F841 (kept while it runs)
    _release_when(cloud, listing, lambda: any(
        c[1] == 'reboot' for c in cloud.ironic.power_calls))
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.ACTIVE, None, None)
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert reboots == [(row.node, 'reboot', True), (row.node, 'reboot', False)]


# --- rule 3: the sync writes on the version it read ---------------------------

def test_the_sync_does_not_stop_an_instance_rebooted_during_its_pass(cloud):
    row = built(cloud)
    manager = cloud.managers['a']
    # The tenant shut the OS down: the node is off.
    cloud.ironic.set_node(row.node, power_state='power off')
    listed = cloud.ironic.list_nodes

    def reboot_meanwhile(*args, **kwargs):
        # The sync lists the node off; then the operator's reboot runs to
        # its end before the sync writes: the row is active again.
        cloud.ironic.list_nodes = listed
        nodes = listed(*args, **kwargs)
        ask(row, 'reboot', hard=True)
        assert carry_out(cloud, row).vm_state == inst.ACTIVE
        return nodes
    cloud.ironic.list_nodes = reboot_meanwhile
    counts = manager.sync_power_states()
    assert counts['stopped'] == 0
    now = db_instances.get(ctx(), row.uuid)
    assert (now.vm_state, now.task_state) == (inst.ACTIVE, None)
    # The next pass sees the node on: nothing to do, nothing powered off.
    assert manager.sync_power_states()['powering off'] == 0
    assert cloud.ironic.nodes[row.node].power_state == 'power on'
    assert [c for c in cloud.ironic.power_calls if c[1] == 'off'] == []


def test_every_write_bumps_the_version(cloud):
    row = built(cloud)
    before = db_instances.get(ctx(), row.uuid).version
    asked = ask(row, 'stop')
    assert asked.version == before + 1
    assert not db_instances.record_power(ctx(), row, inst.POWER_OFF)
    assert db_instances.record_power(ctx(), asked, inst.POWER_ON)
    assert db_instances.get(ctx(), row.uuid).version == before + 2


def test_a_stale_worker_of_an_ended_request_cannot_end_the_next_one(cloud):
    # A worker paused mid-reboot (a second process of the same host, say:
    # same host, same generation) must not record the reboot asked after
    # its own ended as done: the row came back to the values it read
    # (rebooting), but not to its version.
    row = built(cloud)
    first = ask(row, 'reboot', hard=True)
    assert carry_out(cloud, row).task_state is None
    ask(row, 'reboot', hard=True)
    assert db_instances.transition(ctx(), first, inst.REBOOTING,
                                   task_state=None) is None
    assert db_instances.get(ctx(), row.uuid).task_state == inst.REBOOTING
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state) == (inst.ACTIVE, None)
