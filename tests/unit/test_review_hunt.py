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

"""Findings of a review of the exactly-once change (issue 29): each test
reproduced one (F1-F7: it failed before its fix) and now holds it. SQLite
only (the ``cloud`` fixture is narrowed to it below): the rules under test
are in the flows, not in SQL; tests/unit/test_exactly_once.py covers the
three databases.
"""

import threading
import time

import pytest

from ironic_compute.db import instances as db_instances
from ironic_compute.instances import model as inst
from tests.unit import instance_cloud
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import ctx
from tests.unit.test_exactly_once import ClientManager
from tests.unit.test_exactly_once import behind_the_adapter
from tests.unit.test_exactly_once import read_timeout  # noqa: F401
from tests.unit.test_instance_actions import ask
from tests.unit.test_instance_actions import carry_out


@pytest.fixture
def cloud(sqlite_engine):
    """Services a and b on the fake Ironic, on SQLite only."""
    return instance_cloud.make_cloud()


def _run_poller(manager, seconds):
    """Run ``manager``'s poller (and its pool) for ``seconds``, then stop."""
    manager.start()
    try:
        time.sleep(seconds)
    finally:
        manager.stop(5)


# --- F1: an action fenced by its node loops at the poll interval -----------

@pytest.mark.parametrize('action', ['stop', 'reboot'])
def test_f1_a_node_fenced_action_is_not_retried_at_the_poll_interval(
        cloud, action):
    """The node no longer names the instance (an operator freed it in
    Ironic). The fence refuses (Fenced) and manager._run() counts that as
    done, so the retry back-off is forgotten and the poller hands the same
    request again at every instance_poll_interval (0.2 s): two node reads
    and a warning each time, forever; a reboot also rewrites its mark
    (a DB write) each time."""
    row = built(cloud)
    ask(row, action)
    cloud.ironic.set_node(row.node, instance_uuid=None)
    version = db_instances.get(ctx(), row.uuid).version
    reads = []
    cloud.ironic.on_node_get = reads.append
    _run_poller(cloud.managers['a'], 2.0)
    now = db_instances.get(ctx(), row.uuid)
    # Either the request ends (a fault saying why), or it backs off: not
    # ten rounds of Ironic reads (and DB writes) in two seconds.
    assert now.task_state is None or len(reads) <= 6, (
        f'{len(reads)} node reads, {now.version - version} row writes in '
        f'2 s; task still {now.task_state}')


# --- F2: a 5xx answer to a change is not read as "may have been received" ---

class LateConductor:
    """ironicclient over the fake Ironic whose API answers the first call
    named ``late`` with ``error`` (a 500 from the API whose RPC to the
    conductor timed out, a 502/504 from the proxy in front of it) while
    the conductor carries the call out ``delay`` seconds later."""

    def __init__(self, fake, late, error, delay=0.3):
        self.fake, self.late, self.error, self.delay = fake, late, error, delay
        self.attempts = []
        self.node = ClientManager(self, 'node')
        self.allocation = ClientManager(self, 'allocation')

    def call(self, name, *args, **kwargs):
        self.attempts.append(name)
        func = getattr(self.fake, name.replace('.', '_'))
        if name in self.late:
            self.late = ()
            threading.Timer(self.delay, func, args, kwargs).start()
            raise self.error(f'{name}: the gateway gave up waiting')
        return func(*args, **kwargs)


@pytest.mark.parametrize('status', ['InternalServerError', 'BadGateway',
                                    'GatewayTimeout'])
def test_f2_a_reboot_answered_5xx_is_not_sent_again_before_it_settles(
        cloud, status):
    """A 500/502/504 to a change is not in retriable_errors(), so
    _with_retries raises it as it is, provisioning_errors() makes it a
    plain IronicUnavailable (not MaybeSent), and _change() never runs its
    read-and-decide (no lost_answer_settle window). The flow pauses; its
    resume (2 s later in the manager) reads the node before the conductor
    got to the first reboot, sees no change of the mark and sends a
    second reboot: two reboots reach the node."""
    from ironicclient import exc as ironic_exc

    from ironic_compute import ironic
    row = built(cloud)
    cloud.conf.set_override('api_retry_interval', 0, group='ironic')
    client = LateConductor(cloud.ironic, {'node.set_power_state'},
                           getattr(ironic_exc, status))
    provisioner = cloud.managers['a'].provisioner
    provisioner._ironic = ironic.IronicClient(cloud.conf, client=client)
    provisioner.lost_answer_settle = 1.0  # rule 1's window, shortened
    ask(row, 'reboot', hard=True)
    first = carry_out(cloud, row)
    if first.task_state == inst.REBOOTING:  # paused: the manager resumes it
        carry_out(cloud, row)
    time.sleep(0.6)  # the conductor has carried out what it received
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert len(reboots) == 1, reboots


def test_f2_a_rebuild_answered_504_is_not_sent_again_before_it_settles(
        cloud):
    """The same for a rebuild (provision_updated_at is the mark): two
    rebuilds of the tenant's disk."""
    from ironicclient import exc as ironic_exc

    from ironic_compute import ironic
    row = built(cloud)
    cloud.conf.set_override('api_retry_interval', 0, group='ironic')
    client = LateConductor(cloud.ironic, {'node.set_provision_state'},
                           ironic_exc.GatewayTimeout)
    provisioner = cloud.managers['a'].provisioner
    provisioner._ironic = ironic.IronicClient(cloud.conf, client=client)
    provisioner.lost_answer_settle = 1.0
    ask(row, 'rebuild', image='http://img2')
    first = carry_out(cloud, row)
    if first.task_state == inst.REBUILDING:
        carry_out(cloud, row)
    time.sleep(0.6)
    rebuilds = [c for c in cloud.ironic.provision_calls
                if c == (row.node, 'rebuild')]
    assert len(rebuilds) == 1, rebuilds


# --- F3: the fence checks values, not the version (ABA on the send) -------

def test_f3_a_stale_worker_of_an_ended_reboot_does_not_send_it_again(cloud):
    """Two processes of host a (a restart whose old process still runs, a
    cloned VM: what test_exactly_once's own ABA test supposes). The worker
    W1 of reboot R1 is held in the node read its fence checks (the slow
    read, as fencing.py says; then it records its mark and sends). The other process carries R1 out
    to its end; the tenant asks reboot R2: the row is back to host a, the
    same generation, task rebooting. W1's fence (model.fence_refusal)
    compares host, generation and task state only, not the version its
    claim holds, so it passes and W1 sends R1's reboot a second time. The
    version protects W1's final write, not its send."""
    from ironic_compute.instances import manager as instance_manager
    from ironic_compute.instances import power as power_flow
    from tests.unit import fakes
    row = built(cloud)
    other = instance_manager.InstanceManager(
        cloud.conf, 'a', cloud.ironic, cloud.ids['a'],
        lease=fakes.valid_lease())
    other.provisioner.poll_interval = 0.01
    ask(row, 'reboot', hard=True)
    queued = db_instances.get(ctx(), row.uuid)
    held, release = threading.Event(), threading.Event()
    reads = {}

    def hold_w1(uuid):
        me = threading.get_ident()
        if me != w1_ident[0]:
            return
        reads[me] = reads.get(me, 0) + 1
        if reads[me] == 1:  # the read its fence checks the node on
            held.set()
            release.wait(10)
    w1_ident = [None]

    def w1():
        w1_ident[0] = threading.get_ident()
        cloud.managers['a']._run(queued.uuid, power_flow.reboot, queued)
    cloud.ironic.on_node_get = hold_w1
    thread = threading.Thread(target=w1, daemon=True)
    thread.start()
    assert held.wait(10)
    # The other process of host a carries R1 out; then R2 is asked.
    now = db_instances.get(ctx(), row.uuid)
    other._run(now.uuid, power_flow.reboot, now)
    assert db_instances.get(ctx(), row.uuid).task_state is None
    reboots_of_r1 = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert len(reboots_of_r1) == 1
    ask(row, 'reboot', hard=True)  # R2, not yet picked up
    release.set()
    thread.join(10)
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert len(reboots) == 1, (
        f'{len(reboots)} reboots reached the node for R1 (R2 not yet run)')


# --- F4: a node lock (409) on the soft call is taken as "soft refused" ------

class LockedFor:
    """The fake Ironic's power calls answer 409 (the node is locked: a
    conductor task holds it) for the next ``times`` attempts."""

    def __init__(self, fake, times):
        self.fake, self.times = fake, times
        self._call = fake.node_set_power_state
        fake.node_set_power_state = self

    def __call__(self, uuid, state, soft=False, timeout=None):
        from ironicclient import exc as ironic_exc
        if self.times > 0:
            self.times -= 1
            raise ironic_exc.Conflict(
                f'Node {uuid} is locked by host conductor-1, please retry '
                'after the current operation is completed.')
        return self._call(uuid, state, soft=soft, timeout=timeout)


@pytest.mark.parametrize('action, target', [('stop', 'off'),
                                            ('reboot', 'reboot')])
def test_f4_a_locked_node_does_not_turn_a_soft_action_hard(cloud, action,
                                                           target):
    """A 409 is retried api_max_retries times, then surfaces as
    IronicRefused -> ProvisionError. power_off() (power.py:193) and
    send_soft_first() (power.py:259) take any ProvisionError of the soft
    call as "the driver cannot do it soft" and send the HARD call at once:
    a tenant's OS that was asked a clean shutdown is cut off because
    Ironic's lock on the node was busy for a few seconds."""
    row = built(cloud)
    behind_the_adapter(cloud, lose=set())
    cloud.conf.set_override('api_max_retries', 1, group='ironic')
    LockedFor(cloud.ironic, times=2)  # the soft call and its one retry
    ask(row, action)  # soft: no --hard
    carry_out(cloud, row)
    hard = [c for c in cloud.ironic.power_calls
            if c[1] == target and c[2] is False]
    assert hard == [], f'a hard {target} was sent: {cloud.ironic.power_calls}'


# --- F5: the poller's error line at the new 0.2 s interval -------------------

def test_f5_a_database_outage_logs_a_bounded_number_of_lines(
        cloud, monkeypatch, caplog):
    """manager._poll_loop logs one ERROR per poll while the database is
    away ("One line per poll"): at the new default instance_poll_interval
    of 0.2 s that is 5 lines a second, 18000 an hour of outage, per
    service (it was 1 s). The lines should back off (or say it once and
    then every minute, like the lease's "paused" line)."""
    import logging

    from ironic_compute.db import instances as db_rows

    def away(*args, **kwargs):
        raise RuntimeError('database is away')
    monkeypatch.setattr(db_rows, 'pending', away)
    caplog.set_level(logging.ERROR, logger='ironic_compute.instances.manager')
    _run_poller(cloud.managers['a'], 2.0)
    lines = [r for r in caplog.records
             if 'Cannot read the instance requests' in r.getMessage()]
    assert len(lines) <= 3, f'{len(lines)} error lines in 2 s'


# --- F6: a soft reboot that succeeds just after the wait is rebooted hard ---

class SlowSoftReboot:
    """A soft reboot the OS obeys: the node shuts down within Ironic's
    timeout and comes back on, ``late`` seconds after that timeout (the
    power-on half of a soft reboot is not counted in it). Ends well: power
    on, no last_error."""

    def __init__(self, fake, late=0.4):
        self.fake, self.late = fake, late
        self._call = fake.node_set_power_state
        fake.node_set_power_state = self

    def __call__(self, uuid, state, soft=False, timeout=None):
        if not (soft and state == 'reboot'):
            return self._call(uuid, state, soft=soft, timeout=timeout)
        fake = self.fake
        fake.power_calls.append((uuid, state, soft))
        fake._changed(uuid, power=1)
        fake.power_targets[uuid] = 'power on'
        threading.Timer((timeout or 1) + self.late,
                        lambda: fake.power_targets.pop(uuid, None)).start()


def test_f6_a_soft_reboot_that_ends_well_late_is_not_followed_by_a_hard_one(
        cloud):
    """reboot() (power.py:85-105) waits shutdown_timeout for the soft
    reboot, the same timeout Ironic was given for the soft power OFF alone;
    the power-on half comes after. When the wait times out, power_settled()
    waits for Ironic to end the soft reboot and then the hard reboot is
    sent unconditionally, even when Ironic ended the soft one well (power
    on, no last_error, last_power_state_change moved). power_off() checks
    the settled state before its hard call; reboot() does not: a node that
    has just rebooted cleanly is reset hard."""
    row = built(cloud)
    SlowSoftReboot(cloud.ironic)
    ask(row, 'reboot', hard=False)
    done = carry_out(cloud, row)
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert reboots == [(row.node, 'reboot', True)], reboots
    assert (done.vm_state, done.task_state) == (inst.ACTIVE, None)


# --- F7: note_mark() reads any action in flight as "ours was sent" ----------

def test_f7_a_rebuild_never_sent_is_not_recorded_done(cloud):
    """The first attempt of a rebuild records its mark (note_mark) and is
    paused by an Ironic error on the image patch: nothing was sent. At the
    resume, a power action is in flight on the node (an operator's, or
    Ironic's own power sync). note_mark() (power.py:234-240) takes ANY
    target_power_state/target_provision_state as proof that the rebuild
    went out, so the resume only waits: the node, still active on the old
    image, is recorded rebuilt with the new one, and no rebuild ever
    reaches Ironic."""
    row = built(cloud)
    ask(row, 'rebuild', image='http://img2')
    update = cloud.ironic.node_update
    failures = [1]

    def patch_once_unavailable(uuid, patch):
        if failures:
            failures.pop()
            raise RuntimeError('Ironic answered 500 to the image patch')
        return update(uuid, patch)
    cloud.ironic.node_update = patch_once_unavailable
    paused = carry_out(cloud, row)
    assert paused.task_state == inst.REBUILDING  # paused, mark recorded
    assert 'provision_updated_at' in paused.args()
    # An operator's power on is in flight in Ironic as the resume reads.
    cloud.ironic.power_targets[row.node] = 'power on'
    threading.Timer(0.3, lambda: cloud.ironic.power_targets.pop(
        row.node, None)).start()
    done = carry_out(cloud, row)
    rebuilds = [c for c in cloud.ironic.provision_calls
                if c == (row.node, 'rebuild')]
    assert rebuilds or done.image_source != 'http://img2', (
        f'recorded rebuilt with {done.image_source} '
        f'(task {done.task_state}), but no rebuild reached Ironic')
