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

"""Review hunt 8 (issue 29): the flows the earlier hunts did not target:
rescue and unrescue (and the rescue password), the console command, delete
and reap, the power-state sync, the takeover, and the lost-answer path of
calls.py (``_change``, ``landed``) as these flows use it.

Findings, each fixed with this file (its test failed before the fix):

J1  A secret quoted by an error is scrubbed only *after* one_line()
    collapsed the error's whitespace (calls.IronicCalls._send builds the
    ProvisionError from ``one_line(exc)``; redaction.secret_kept_out then
    looks for the secret as it is). A rescue password with a run of
    whitespace, or user data with an indented line (any cloud-config), no
    longer matches: the error goes into the instance's fault and the
    ERROR log line with the secret in it. Fixed: redaction's forms of a
    secret include each form with its whitespace collapsed.
J2  keystoneauth's DEBUG line of a *response* body is not kept out of the
    log: ironic._HideSecretBodies cuts a line at " -d " (the request's curl
    line) and keeps everything when there is none, so "RESP BODY: {...
    "rescue_password": ...}" is logged whole, under a note that says the
    body was not logged; with split loggers the body goes to
    ``keystoneauth.session.body``, which has no filter at all. Ironic
    answers a PATCH (the delete's lessee clear on a rescued node) and a
    node read with instance_info, which holds the plain rescue password
    while the node is rescued (and the deploy's config drive), to a user
    that may see instance secrets. Fixed: an answer's body line that holds
    a secret field keeps its "RESP BODY:" only, and the filter is on the
    split loggers' response and body loggers too.
J3  ``instance remove`` of an instance with a rescue queued keeps the
    rescue password in the (deleted) row's task_args for good: only the
    ends of the task and request_delete drop it (db/admin.py
    remove_instance). Fixed: remove_instance drops task_args, and so does
    the delete's soft_delete.

Checked and found sound (pinned below, they pass): a rescue or an unrescue
whose answer is lost is not sent again, and one Ironic never took is sent
again once, with its password once; a rescue asked again on a rescued node
(it ends where it began) is not done on a listing begun before its call; a
delete whose undeploy answer is lost sends one undeploy, and sends none
again once the node serves another instance (the fence); a reap's calls
are refused once its node's row moved to another service; the power-state
sync writes nothing over a row that went through a rescue and an unrescue
(ABA: values back as read, version not); the console's fence runs again
before the retry of a 409; the takeover moves nothing whose generation
changed since it read it. SQLite only: the rules under test are in the
flows.
"""

import json
import logging
import time

import pytest
import requests
from ironicclient import exc as ironic_exc
from keystoneauth1 import session as ks_session

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.cmd import instance_console
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import models
from ironic_compute.db import takeover as db_takeover
from ironic_compute.instances import configdrive
from ironic_compute.instances import model as inst
from ironic_compute.instances import teardown
from tests.unit import instance_cloud
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import ctx
from tests.unit.test_configdrive import rebuild_refused_quoting
from tests.unit.test_exactly_once import StaleListing
from tests.unit.test_exactly_once import _in_flight_listing
from tests.unit.test_exactly_once import _in_thread
from tests.unit.test_exactly_once import _release_when
from tests.unit.test_exactly_once import behind_the_adapter
from tests.unit.test_exactly_once import read_timeout
from tests.unit.test_exactly_once import reset_after_sending
from tests.unit.test_rescue import ask
from tests.unit.test_rescue import ask_rescue
from tests.unit.test_rescue import carry_out

PASSWORD = 'c0rrect  horse battery staple'  # two spaces after the first word


@pytest.fixture
def cloud(sqlite_engine):
    """Services a and b on the fake Ironic, on SQLite only."""
    return instance_cloud.make_cloud()


def collapsed(text):
    """``text`` as one_line() writes it: every whitespace run one space."""
    return ' '.join(text.split())


def rescue_calls(cloud, node):
    return cloud.ironic.provision_calls.count((node, 'rescue'))


# --- J1: a secret with a whitespace run escapes the scrub ---------------------

def rescue_refused_quoting(cloud, password):
    """A rescue with ``password`` carried out on a built instance, Ironic
    refusing it with an error that quotes the password (the premise of
    test_rescue's scrub test): the row at its end."""
    row = built(cloud)
    ask_rescue(row, password=password)
    real = cloud.ironic.node_set_provision_state

    def refuses(uuid, target, rescue_password=None):
        if target == 'rescue':
            raise ironic_exc.BadRequest(
                f'invalid rescue_password {rescue_password}')
        return real(uuid, target)
    cloud.ironic.node_set_provision_state = refuses
    return carry_out(cloud, row)


def test_j1_an_error_quoting_a_password_with_two_spaces_is_scrubbed(
        cloud, caplog):
    caplog.set_level(logging.DEBUG)
    done = rescue_refused_quoting(cloud, PASSWORD)
    assert done.task_state is None and done.fault.startswith('rescuing: ')
    for text in (done.fault, caplog.text):
        assert collapsed(PASSWORD) not in text, text


INDENTED = ('#cloud-config\nchpasswd:\n  expire: false\n  users:\n'
            '    - {name: root, password: MARKER-9c2e}\n')


def test_j1_an_error_quoting_indented_user_data_is_scrubbed(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    # As test_configdrive's scrub test has Ironic quote it.
    done = rebuild_refused_quoting(
        cloud, configdrive.ConfigDrive(user_data=INDENTED))
    assert done.task_state is None and done.fault.startswith('rebuilding: ')
    assert 'MARKER-9c2e' not in done.fault + caplog.text


def test_j1_a_password_without_whitespace_runs_is_scrubbed(cloud, caplog):
    """What J1 leaves working: the same error, a password with single
    spaces only, is scrubbed (test_rescue pins it too)."""
    caplog.set_level(logging.DEBUG)
    password = collapsed(PASSWORD)
    done = rescue_refused_quoting(cloud, password)
    assert '***' in done.fault
    assert password not in done.fault + caplog.text


# --- J2: keystoneauth's DEBUG line of a response body ---------------------------

class _Canned(requests.adapters.BaseAdapter):
    """A transport that answers every request with ``body`` (JSON, 200):
    Ironic's answer, for keystoneauth's own logging."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def send(self, request, **kwargs):
        response = requests.Response()
        response.status_code = 200
        response.headers['Content-Type'] = 'application/json'
        response._content = self.body.encode()
        response.request, response.url = request, request.url
        return response

    def close(self):
        pass


# Ironic's answer to the lessee clear of a rescued node (a PATCH answers
# with the node): its instance_info holds the plain rescue password while
# the node is rescued (the agent's finalize_rescue reads it there), shown
# to a user allowed to see instance secrets.
RESCUED_NODE = json.dumps({
    'uuid': 'n-1', 'provision_state': 'rescue', 'lessee': None,
    'instance_info': {'image_source': 'http://img',
                      inst.RESCUE_PASSWORD: PASSWORD,
                      'hashed_rescue_password': '$6$x$y'}})


@pytest.mark.parametrize('split', [False, True], ids=['one-logger', 'split'])
def test_j2_keystoneauth_s_debug_line_of_an_answer_keeps_no_password(
        caplog, split):
    assert ironic._HideSecretBodies  # importing ironic installs the filter
    caplog.set_level(logging.DEBUG, logger='keystoneauth')
    session = ks_session.Session(split_loggers=split)
    session.session.mount('http://', _Canned(RESCUED_NODE))
    session.request('http://ironic/v1/nodes/n-1', 'PATCH',
                    json=[{'op': 'remove', 'path': '/lessee'}],
                    authenticated=False)
    assert 'RESP' in caplog.text or 'n-1' in caplog.text  # it was logged
    assert PASSWORD not in caplog.text


@pytest.mark.parametrize('split', [False, True], ids=['one-logger', 'split'])
def test_j2_an_answer_whose_user_data_holds_a_dash_d_keeps_none_of_it(
        caplog, split):
    """A request's line is cut at its curl " -d "; an answer's body may
    hold one too (user data running "docker run -d"), and none of it is
    kept."""
    caplog.set_level(logging.DEBUG, logger='keystoneauth')
    node = {'uuid': 'n-1', 'instance_info': {'configdrive': {
        'user_data': '#!/bin/sh\ndocker run -d MARKER-5f1a\n'}}}
    session = ks_session.Session(split_loggers=split)
    session.session.mount('http://', _Canned(json.dumps(node)))
    session.request('http://ironic/v1/nodes/n-1', 'GET', authenticated=False)
    assert '(body not logged: it holds a config drive)' in caplog.text
    assert 'MARKER-5f1a' not in caplog.text and 'docker' not in caplog.text


def test_j2_keystoneauth_s_debug_line_of_a_rescue_request_keeps_no_body(
        caplog):
    """What the filter does hold: the request's curl line, from
    keystoneauth itself (not a line the test writes)."""
    caplog.set_level(logging.DEBUG, logger='keystoneauth')
    for split in (False, True):
        session = ks_session.Session(split_loggers=split)
        session.session.mount('http://', _Canned('{}'))
        session.request('http://ironic/v1/nodes/n-1/states/provision', 'PUT',
                        json={'target': 'rescue',
                              inst.RESCUE_PASSWORD: PASSWORD},
                        authenticated=False)
    assert caplog.text.count('(body not logged: it holds a rescue '
                             'password)') == 2
    assert PASSWORD not in caplog.text


# --- J3: instance remove keeps the password ---------------------------------

def test_j3_instance_remove_drops_a_queued_rescue_password(cloud):
    row = built(cloud)
    ask_rescue(row, password=PASSWORD)
    admin.remove_instance(ctx(), row.uuid, force=True)
    gone = db_instances.get(ctx(), row.uuid, deleted=True)
    assert gone.vm_state == inst.REMOVED
    assert PASSWORD not in (gone.task_args or '')


def test_j3_every_other_end_drops_the_password(cloud):
    """Done, refused, failed in Ironic, and a delete asked meanwhile."""
    rows = [built(cloud, 'a', 1), built(cloud, 'b', 2)]
    ask_rescue(rows[0], password=PASSWORD)
    assert carry_out(cloud, rows[0]).task_args is None  # done
    cloud.ironic.rescue_fails = True
    ask_rescue(rows[0], password=PASSWORD)
    assert carry_out(cloud, rows[0]).task_args is None  # failed in Ironic
    cloud.ironic.rescue_fails = False
    cloud.ironic.set_node(rows[1].node, provision_state='deploy failed')
    ask_rescue(rows[1], password=PASSWORD)
    assert carry_out(cloud, rows[1]).task_args is None  # refused
    cloud.ironic.set_node(rows[1].node, provision_state='active')
    ask_rescue(rows[1], password=PASSWORD)
    assert db_instances.request_delete(ctx(), rows[1].uuid).task_args is None


# --- pinned: rescue and unrescue after a lost answer ------------------------

@pytest.mark.parametrize('error', [read_timeout, reset_after_sending])
def test_a_rescue_whose_answer_is_lost_is_not_sent_again(cloud, error):
    row = built(cloud)
    client = behind_the_adapter(cloud, lose={'node.set_provision_state'},
                                error=error)
    ask_rescue(row, password=PASSWORD)
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.RESCUED, None, None)
    assert client.attempts.count('node.set_provision_state') == 1
    assert cloud.ironic.rescue_passwords == [PASSWORD]
    # The unrescue's answer lost too: one unrescue.
    client.times = 1
    ask(row, 'unrescue')
    back = carry_out(cloud, row)
    assert (back.vm_state, back.task_state, back.fault) == (
        inst.ACTIVE, None, None)
    assert cloud.ironic.provision_calls.count((row.node, 'unrescue')) == 1


def test_a_rescue_ironic_never_took_is_sent_again_once(cloud):
    row = built(cloud)
    client = behind_the_adapter(cloud, lose={'node.set_provision_state'},
                                error=reset_after_sending, taken=False)
    ask_rescue(row, password=PASSWORD)
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state) == (inst.RESCUED, None)
    assert client.attempts.count('node.set_provision_state') == 2
    assert cloud.ironic.rescue_passwords == [PASSWORD]


def test_a_rescue_again_is_not_done_on_a_listing_begun_before_it(cloud):
    """A rescue of a rescued node ends in "rescue", where it began: a
    listing begun before the call says "rescue, no target"."""
    row = built(cloud)
    ask_rescue(row)
    carry_out(cloud, row)
    ask_rescue(row, password='a new one')
    cloud.ironic.rescue_hangs = True  # "rescue wait" until the test ends it
    listing = StaleListing(cloud.ironic)
    watches = _in_flight_listing(cloud)  # noqa: F841 (kept while it runs)
    _release_when(cloud, listing,
                  lambda: rescue_calls(cloud, row.node) == 2)
    worker, result = _in_thread(carry_out, cloud, row)
    time.sleep(0.8)
    assert worker.is_alive()
    assert db_instances.get(ctx(), row.uuid).task_state == inst.RESCUING
    cloud.ironic.targets.pop(row.node)
    cloud.ironic.set_node(row.node, provision_state='rescue failed')
    worker.join(10)
    failed = result['value']
    assert (failed.vm_state, failed.task_state) == (inst.RESCUED, None)
    assert 'rescue failed' in failed.fault
    assert rescue_calls(cloud, row.node) == 2


# --- pinned: delete and reap --------------------------------------------------

def undeploys(cloud, node):
    return cloud.ironic.provision_calls.count((node, 'deleted'))


def test_a_delete_whose_undeploy_answer_is_lost_undeploys_once(cloud):
    row = built(cloud)
    client = behind_the_adapter(cloud, lose={'node.set_provision_state'})
    deleting = db_instances.request_delete(ctx(), row.uuid)
    cloud.managers['a']._run(row.uuid, teardown.delete, deleting)
    assert db_instances.get(ctx(), row.uuid) is None
    assert client.attempts.count('node.set_provision_state') == 1
    assert undeploys(cloud, row.node) == 1


def test_a_lost_undeploy_is_not_sent_again_once_the_node_serves_another(
        cloud):
    """The undeploy was taken and the node cleaned, and another build
    reserved and deployed it before the lost answer's reads: they show an
    active node with no target (the undeploy looks not taken), so the
    undeploy would be sent again, to another tenant's node. The fence's
    node read stops it."""
    row = built(cloud)
    behind_the_adapter(cloud, lose={'node.set_provision_state'})
    real = cloud.ironic.node_set_provision_state
    other = '00000000-0000-0000-0000-0000000000ff'

    def and_taken_by_another(uuid, target, **kwargs):
        real(uuid, target, **kwargs)
        if target == 'deleted':
            instance_cloud.allocate(cloud, other, uuid)
            cloud.ironic.set_node(uuid, provision_state='active')
    cloud.ironic.node_set_provision_state = and_taken_by_another
    deleting = db_instances.request_delete(ctx(), row.uuid)
    cloud.managers['a']._run(row.uuid, teardown.delete, deleting)
    assert undeploys(cloud, row.node) == 1
    # Tried again after the back-off: the node is another's, left alone.
    again = db_instances.get(ctx(), row.uuid)
    assert again.task_state == inst.DELETING
    cloud.managers['a']._run(row.uuid, teardown.delete, again)
    assert db_instances.get(ctx(), row.uuid) is None
    assert undeploys(cloud, row.node) == 1
    node = cloud.ironic.nodes[row.node]
    assert (node.instance_uuid, node.provision_state) == (other, 'active')


def test_a_reap_sends_nothing_once_its_node_s_row_moved(cloud):
    """A node whose instance was deleted while its host was down: the
    service that held its row, paused before the undeploy, sends nothing
    once the row is another service's."""
    row = built(cloud)
    with db_api.get_engine().begin() as conn:
        conn.execute(models.instances.update()
                     .where(models.instances.c.uuid == row.uuid)
                     .values(deleted=models.instances.c.id,
                             vm_state=inst.DELETED, task_state=None))
    holder = db_nodes.load_rows_of(ctx(), 'a', [row.node]).get(row.node)
    assert holder is not None and holder.host == 'a'
    db_nodes.move(ctx(), [row.node], 'a', 'b', cloud.ids['b'])
    cloud.managers['a']._run(('reap', row.node), teardown.reap, row.node,
                             row.uuid)  # Fenced: logged, left
    assert undeploys(cloud, row.node) == 0
    assert cloud.ironic.nodes[row.node].instance_uuid == row.uuid
    # Its holder now reaps it, once.
    assert teardown.reap(cloud.managers['b'].worker, row.node, row.uuid)
    assert cloud.ironic.nodes[row.node].instance_uuid is None
    assert undeploys(cloud, row.node) == 1


# --- pinned: the power-state sync's write is on the version -----------------

def test_the_sync_writes_nothing_over_a_rescue_and_unrescue_during_its_pass(
        cloud):
    """The sync read the row (active), then listed the node off; meanwhile
    the instance was rescued and unrescued (the row is back to active, no
    task, same host and generation: the values it read) and the node is on.
    A write conditional on values would record it stopped."""
    row = built(cloud)
    manager = cloud.managers['a']
    cloud.ironic.set_node(row.node, power_state='power off')
    real = cloud.ironic.list_nodes

    def listing(*args, **kwargs):
        cloud.ironic.list_nodes = real
        stale = real(*args, **kwargs)
        ask_rescue(row)
        carry_out(cloud, row)
        ask(row, 'unrescue')
        carry_out(cloud, row)
        cloud.ironic.set_node(row.node, power_state='power on')
        return stale
    cloud.ironic.list_nodes = listing
    before = db_instances.get(ctx(), row.uuid)
    counts = manager.sync_power_states()
    after = db_instances.get(ctx(), row.uuid)
    assert counts['stopped'] == 0
    assert (after.vm_state, after.task_state) == (inst.ACTIVE, None)
    assert after.version > before.version
    assert (after.host, after.generation) == (before.host, before.generation)
    assert manager.sync_power_states()['stopped'] == 0  # the node is on


# --- pinned: the console's fence before each attempt --------------------------

class _Locked:
    """ironicclient over the fake: set_console_mode answers 409 (the node
    is locked) once, and ``meanwhile`` runs then."""

    def __init__(self, fake, meanwhile):
        self.fake, self.meanwhile, self.locked = fake, meanwhile, True
        self.attempts = 0
        outer = self

        class _Node:
            def __getattr__(self, name):
                return getattr(fake, f'node_{name}')

            def set_console_mode(self, uuid, enabled):
                outer.attempts += 1
                if outer.locked:
                    outer.locked = False
                    outer.meanwhile()
                    raise ironic_exc.Conflict(f'node {uuid} is locked')
                return fake.node_set_console_mode(uuid, enabled)
        self.node = _Node()


def test_the_console_is_not_enabled_on_the_retry_once_the_instance_goes(
        cloud, monkeypatch):
    row = built(cloud)
    cloud.conf.set_override('api_retry_interval', 0, group='ironic')
    locked = _Locked(cloud.ironic, lambda: db_instances.request_delete(
        ctx(), row.uuid))
    monkeypatch.setattr(instance_console, '_client', lambda: (
        ironic.IronicClient(cloud.conf, client=locked)))

    def refusal():
        current = db_instances.get(ctx(), row.uuid)
        return ('it is being deleted'
                if current.task_state == inst.DELETING else None)
    with pytest.raises(exception.CommandError, match='it is being deleted'):
        instance_console.set_console(row.uuid, row.node, True, refusal)
    assert locked.attempts == 1
    assert cloud.ironic.console_calls == []


# --- pinned: the takeover names the generation it read -----------------------

def test_a_takeover_moves_nothing_whose_generation_changed_since_it_read(
        cloud):
    row = built(cloud)
    instance_cloud.silence('a', instance_cloud.SDT + instance_cloud.GRACE + 5)
    seen = next(r for r in db_takeover.of_hosts(ctx(), ['a'])
                if r.uuid == row.uuid)
    # Moved by an operator (node move) and back to a meanwhile: host a
    # again, a new generation.
    with db_api.get_engine().begin() as conn:
        conn.execute(models.instances.update()
                     .where(models.instances.c.uuid == row.uuid)
                     .values(generation=models.instances.c.generation + 2,
                             version=models.instances.c.version + 2))
    assert not db_takeover.take_over(
        ctx(), seen, 'b', cloud.ids['b'],
        instance_cloud.SDT + instance_cloud.GRACE)
    assert db_instances.get(ctx(), row.uuid).host == 'a'

