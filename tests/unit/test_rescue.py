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

"""instance rescue and unrescue, on SQLite, MariaDB and PostgreSQL, against
the fake Ironic: queued on the row, carried out by the managing host (and by
its successor), never sent twice, the password on the row only until the
action ends and never in a log."""

import dataclasses
import json
import logging

import pytest

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import manager as manager_mod
from ironic_compute.instances import model as inst
from ironic_compute.instances import rescue as rescue_flow
from ironic_compute.instances import teardown
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import ctx
from tests.unit.instance_cloud import take_over

PASSWORD = 'c0rrect horse "battery" staple'


def ask(row, action, **args):
    return db_instances.request_action(ctx(), row.uuid, action, **args)


def ask_rescue(row, password=PASSWORD):
    return ask(row, 'rescue', **{inst.RESCUE_PASSWORD: password})


def carry_out(cloud, row, host=None):
    """The managing host's worker runs the queued task once, as the
    manager dispatches it."""
    queued = db_instances.get(ctx(), row.uuid)
    flow = manager_mod.FLOWS[inst.next_action(queued.task_state)]
    cloud.managers[host or queued.host]._run(queued.uuid, flow, queued)
    return db_instances.get(ctx(), row.uuid)


def rescues(cloud, row):
    return cloud.ironic.provision_calls.count((row.node, 'rescue'))


def killed(*args, **kwargs):
    raise exception.Stopped('killed')


# --- the state machine ------------------------------------------------------------

def test_rescue_then_unrescue(cloud):
    row = built(cloud)
    queued = ask_rescue(row)
    assert (queued.vm_state, queued.task_state) == (inst.ACTIVE,
                                                    inst.RESCUING)
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.RESCUED, None, None)
    assert done.task_args is None  # the password is gone from the row
    assert cloud.ironic.nodes[row.node].provision_state == 'rescue'
    assert cloud.ironic.rescue_passwords == [PASSWORD]
    assert ask(row, 'unrescue').task_state == inst.UNRESCUING
    back = carry_out(cloud, row)
    assert (back.vm_state, back.task_state, back.fault) == (
        inst.ACTIVE, None, None)
    assert cloud.ironic.nodes[row.node].provision_state == 'active'
    assert cloud.ironic.provision_calls.count((row.node, 'unrescue')) == 1


def test_a_rescued_instance_refuses_the_power_actions_and_can_be_deleted(
        cloud):
    row = built(cloud)
    ask_rescue(row)
    carry_out(cloud, row)
    for action in ('stop', 'start', 'reboot', 'rebuild'):
        with pytest.raises(exception.RequestRefused,
                           match=f'cannot {action} .*: it is rescued'):
            ask(row, action)
    with pytest.raises(exception.RequestRefused,
                       match='it is active; unrescue needs rescued'):
        ask(built(cloud, 'b', 2), 'unrescue')
    deleting = db_instances.request_delete(ctx(), row.uuid)
    cloud.managers['a']._run(row.uuid, teardown.delete, deleting)
    assert db_instances.get(ctx(), row.uuid, deleted=True).vm_state == (
        inst.DELETED)
    assert cloud.ironic.nodes[row.node].provision_state == 'available'


def test_a_delete_asked_during_a_rescue_drops_the_password(cloud):
    row = built(cloud)
    ask_rescue(row)
    deleting = db_instances.request_delete(ctx(), row.uuid)
    assert deleting.task_state == inst.DELETING and deleting.task_args is None
    assert rescues(cloud, row) == 0


def test_a_rescue_ironic_refuses_keeps_the_state_with_a_fault(cloud):
    row = built(cloud)
    cloud.ironic.set_node(row.node, provision_state='deploy failed')
    ask_rescue(row)
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state, done.task_args) == (
        inst.ACTIVE, None, None)
    assert done.fault.startswith('rescuing: cannot rescue')
    assert PASSWORD not in done.fault


def test_a_rescue_that_fails_in_ironic_leaves_it_rescued_for_an_unrescue(
        cloud):
    row = built(cloud)
    cloud.ironic.rescue_fails = True
    ask_rescue(row)
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state, done.task_args) == (
        inst.RESCUED, None, None)
    assert 'rescue failed' in done.fault
    cloud.ironic.rescue_fails = False
    ask(row, 'unrescue')
    back = carry_out(cloud, row)
    assert (back.vm_state, back.fault) == (inst.ACTIVE, None)


def test_a_rescue_without_a_password_fails_without_a_call(cloud):
    row = built(cloud)
    ask(row, 'rescue')
    done = carry_out(cloud, row)
    assert (done.vm_state, done.fault) == (inst.ACTIVE,
                                           'rescuing: no rescue password')
    assert rescues(cloud, row) == 0


# --- a kill, a takeover -------------------------------------------------------------

def test_a_rescue_resumed_after_a_kill_after_its_call_is_not_sent_again(
        cloud):
    row = built(cloud)
    ask_rescue(row)
    manager = cloud.managers['a']
    real_wait = manager.provisioner.wait_for
    manager.provisioner.wait_for = killed
    carry_out(cloud, row)
    left = db_instances.get(ctx(), row.uuid)
    assert left.task_state == inst.RESCUING and rescues(cloud, row) == 1
    manager.provisioner.wait_for = real_wait
    done = carry_out(cloud, row)  # restarted: the same task again
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.RESCUED, None, None)
    assert rescues(cloud, row) == 1


def test_a_rescue_killed_before_its_call_sends_it_once_on_resume(cloud):
    row = built(cloud)
    ask_rescue(row)
    manager = cloud.managers['a']
    real_rescue = manager.provisioner.rescue
    manager.provisioner.rescue = killed
    carry_out(cloud, row)
    assert db_instances.get(ctx(), row.uuid).task_state == inst.RESCUING
    manager.provisioner.rescue = real_rescue
    done = carry_out(cloud, row)
    assert done.vm_state == inst.RESCUED
    assert rescues(cloud, row) == 1
    assert cloud.ironic.rescue_passwords == [PASSWORD]


def test_an_unrescue_resumed_after_a_kill_is_not_sent_again(cloud):
    row = built(cloud)
    ask_rescue(row)
    carry_out(cloud, row)
    ask(row, 'unrescue')
    manager = cloud.managers['a']
    real_wait = manager.provisioner.wait_for
    manager.provisioner.wait_for = killed
    carry_out(cloud, row)
    manager.provisioner.wait_for = real_wait
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state) == (inst.ACTIVE, None)
    assert cloud.ironic.provision_calls.count((row.node, 'unrescue')) == 1


def test_the_successor_rescues_an_instance_whose_host_died(cloud):
    row = built(cloud)
    ask_rescue(row)  # a is down: nobody carries it out...
    taken = take_over(row.uuid, 'a', 'b', cloud)
    assert taken.task_state == inst.RESCUING
    done = carry_out(cloud, taken, host='b')
    assert (done.host, done.vm_state, done.task_state) == (
        'b', inst.RESCUED, None)
    assert cloud.ironic.rescue_passwords == [PASSWORD]
    # ...and a, resuming with its stale row, sends nothing.
    stale = dataclasses.replace(
        done, host='a', generation=row.generation,
        task_state=inst.RESCUING,
        task_args=f'{{"{inst.RESCUE_PASSWORD}": "x"}}')
    cloud.managers['a']._run(row.uuid, rescue_flow.rescue, stale)
    assert rescues(cloud, row) == 1


def test_the_successor_waits_for_a_rescue_its_dead_host_sent(cloud):
    row = built(cloud)
    ask_rescue(row)
    cloud.ironic.rescue_hangs = True  # the ramdisk has not called back
    manager = cloud.managers['a']
    real_wait = manager.provisioner.wait_for
    manager.provisioner.wait_for = killed
    carry_out(cloud, row)
    manager.provisioner.wait_for = real_wait
    taken = take_over(row.uuid, 'a', 'b', cloud)
    # The ramdisk calls back: Ironic ends the rescue.
    cloud.ironic.targets.pop(row.node)
    cloud.ironic.set_node(row.node, provision_state='rescue')
    done = carry_out(cloud, taken, host='b')
    assert (done.host, done.vm_state) == ('b', inst.RESCUED)
    assert rescues(cloud, row) == 1


# --- the power-state sync ---------------------------------------------------------

def test_the_sync_leaves_a_rescued_instance_alone(cloud):
    row = built(cloud)
    ask_rescue(row)
    rescued = carry_out(cloud, row)
    cloud.ironic.set_node(row.node, power_state='power off')
    counts = cloud.managers['a'].sync_power_states()
    assert counts == {'recorded': 0, 'stopped': 0, 'powering off': 0,
                      'skipped': 1}
    after = db_instances.get(ctx(), row.uuid)
    assert (after.vm_state, after.power_state, after.version) == (
        inst.RESCUED, rescued.power_state, rescued.version)


def test_the_sync_rule_leaves_rescued_alone():
    assert inst.power_sync(inst.RESCUED, None, inst.POWER_OFF, False) is None
    assert inst.power_sync(inst.RESCUED, None, inst.POWER_ON, False) is None


# --- the password ------------------------------------------------------------------

def test_the_password_is_never_logged(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    row = built(cloud)
    ask_rescue(row)
    cloud.managers['a'].provisioner.wait_for = killed
    carry_out(cloud, row)
    row = db_instances.get(ctx(), row.uuid)
    assert PASSWORD not in repr(row)
    cloud.ironic.unavailable = True  # paused: logged with its error
    carry_out(cloud, row)
    assert PASSWORD not in caplog.text
    assert 'rescuing' in caplog.text


def test_an_error_quoting_the_password_is_scrubbed(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    row = built(cloud)
    ask_rescue(row)
    real = cloud.ironic.node_set_provision_state

    def refuses(uuid, target, rescue_password=None):
        if target == 'rescue':
            from ironicclient import exc as ironic_exc
            raise ironic_exc.BadRequest(f'bad password {rescue_password!r}')
        return real(uuid, target)
    cloud.ironic.node_set_provision_state = refuses
    cloud.ironic.node.set_provision_state = refuses
    done = carry_out(cloud, row)
    assert done.fault.startswith('rescuing: ') and '***' in done.fault
    assert PASSWORD not in done.fault
    assert PASSWORD not in caplog.text


def test_a_statement_error_does_not_show_its_parameters(migrated_engine):
    import sqlalchemy as sa
    from oslo_db import exception as db_exc
    # The engine is shared with the tests after this one (one migrated
    # database per process): what it hid before is put back, not False.
    hid_before = migrated_engine.hide_parameters
    db_api.hide_parameters(migrated_engine)
    try:
        with pytest.raises((sa.exc.DBAPIError, db_exc.DBError)) as caught:
            with migrated_engine.connect() as conn:
                conn.execute(sa.text('SELECT no_such_column FROM instances '
                                     'WHERE task_args = :a'),
                             {'a': PASSWORD})
        error = caught.value
        assert PASSWORD not in str(error)
        assert PASSWORD not in str(getattr(error, 'inner_exception', ''))
    finally:
        migrated_engine.hide_parameters = hid_before


@pytest.mark.parametrize('text, why', [
    ('', 'the rescue password is empty'),
    ('  \n', 'the rescue password is empty'),
    ('one\ntwo\n', 'the rescue password must be one line'),
    ('x' * 5000, 'the rescue password is longer than 4096 characters'),
])
def test_a_bad_password_is_refused(text, why):
    with pytest.raises(exception.InvalidRequest) as caught:
        inst.rescue_password(text)
    assert str(caught.value) == why


def test_a_password_loses_one_line_end():
    assert inst.rescue_password('pw\r\n') == 'pw'
    assert inst.rescue_password(' pw \n') == ' pw '


def test_keystoneauth_s_debug_line_of_a_rescue_keeps_no_body(caplog):
    # What keystoneauth logs at DEBUG for each request (its curl line),
    # when an operator lowers its level from oslo.log's WARN.
    from ironic_compute import ironic  # noqa: F401 - installs the filter
    caplog.set_level(logging.DEBUG, logger='keystoneauth')
    body = json.dumps({'target': 'rescue', inst.RESCUE_PASSWORD: PASSWORD})
    for name in ('keystoneauth.session', 'keystoneauth.session.request'):
        logging.getLogger(name).debug(
            "REQ: curl -g -i -X PUT http://ironic/v1/nodes/n/states/provision "
            "-d '%s'", body)
    assert 'c0rrect horse' not in caplog.text  # nor its JSON form
    assert caplog.text.count('PUT http://ironic/v1/nodes/n/states/provision '
                             '(body not logged') == 2


def test_a_rescued_instance_is_rescued_again_with_a_new_password(cloud):
    row = built(cloud)
    ask_rescue(row)
    carry_out(cloud, row)
    ask_rescue(row, password='another one')
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.RESCUED, None, None)
    assert cloud.ironic.rescue_passwords == [PASSWORD, 'another one']
