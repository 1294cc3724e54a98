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

"""instance rescue / unrescue / console: the password comes from a file or
standard input and is never shown; bad input is refused in one line with
nothing queued; the console is Ironic's, for a live instance's own node."""

import io
import sys

import pytest

from ironic_compute.cmd import instance_console
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import model as inst
from tests.unit import fakes
from tests.unit.cmd.test_manage_admin import instance_uuid
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service

PASSWORD = 's3cret "rescue" pw'


def row(uuid):
    return db_instances.get(db_api.Context(), uuid, deleted=True)


def test_rescue_reads_the_password_from_a_file_and_never_shows_it(
        instance, manage_cli, tmp_path):
    secret = tmp_path / 'pw'
    secret.write_text(PASSWORD + '\n')
    result = manage_cli('instance', 'rescue', instance, '--password-file',
                        str(secret), '--format', 'json')
    shown = result.json()
    assert (shown['vm_state'], shown['task_state']) == (inst.ACTIVE,
                                                        inst.RESCUING)
    assert PASSWORD not in result.out + result.err
    assert row(instance).args() == {inst.RESCUE_PASSWORD: PASSWORD}
    for fmt in ('table', 'json'):
        result = manage_cli('instance', 'show', instance, '--format', fmt)
        assert result.code == 0 and 'rescuing' in result.out
        assert PASSWORD not in result.out + result.err
    listed = manage_cli('instance', 'list', '--format', 'json')
    assert PASSWORD not in listed.out


def test_rescue_reads_the_password_from_standard_input(
        instance, manage_cli, monkeypatch):
    monkeypatch.setattr(sys, 'stdin', io.StringIO(PASSWORD))
    result = manage_cli('instance', 'rescue', instance)
    assert result.code == 0 and PASSWORD not in result.out + result.err
    assert row(instance).args() == {inst.RESCUE_PASSWORD: PASSWORD}


@pytest.mark.parametrize('content, why', [
    (None, 'cannot read the rescue password from {path}: No such file'),
    ('', 'the rescue password is empty'),
    ('   \n', 'the rescue password is empty'),
    ('a\nb\n', 'the rescue password must be one line'),
    (b'\xff\xfe', 'the rescue password is not UTF-8 text'),
])
def test_a_bad_password_is_refused_in_one_line_and_nothing_is_queued(
        instance, manage_cli, tmp_path, content, why):
    path = tmp_path / 'pw'
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    before = row(instance)
    manage_cli('instance', 'rescue', instance, '--password-file',
               str(path)).one_line_error(why.format(path=path))
    after = row(instance)
    assert (after.task_state, after.task_args, after.version) == (
        None, None, before.version)


def test_an_empty_standard_input_is_refused(instance, manage_cli,
                                            monkeypatch):
    monkeypatch.setattr(sys, 'stdin', io.StringIO(''))
    manage_cli('instance', 'rescue', instance).one_line_error(
        'the rescue password is empty')
    assert row(instance).task_state is None


def test_unrescue_needs_a_rescued_instance(instance, manage_cli):
    manage_cli('instance', 'unrescue', instance).one_line_error(
        f'cannot unrescue instance {instance}: it is active; unrescue needs '
        'rescued')
    db_instances.transition(db_api.Context(), row(instance), None,
                            vm_state=inst.RESCUED)
    shown = manage_cli('instance', 'unrescue', instance, '--format',
                       'json').json()
    assert (shown['vm_state'], shown['task_state']) == (inst.RESCUED,
                                                        inst.UNRESCUING)


# --- instance console ---------------------------------------------------------------

@pytest.fixture
def ironic(monkeypatch):
    fake = fakes.FakeBaremetal([fakes.make_node(uuid=node_uuid(1))])
    fake.set_node(node_uuid(1), instance_uuid=instance_uuid(1),
                  provision_state='active')
    monkeypatch.setattr(instance_console, '_client', lambda: fake)
    return fake


def test_console_enables_and_disables_and_shows_what_ironic_says(
        instance, manage_cli, ironic):
    shown = manage_cli('instance', 'console', instance, '--format',
                       'json').json()
    assert shown == {'instance': instance, 'node': node_uuid(1),
                     'console_enabled': True, 'console_type': 'socat',
                     'console_url': 'tcp://192.0.2.1:8023',
                     'console_info': {'type': 'socat',
                                      'url': 'tcp://192.0.2.1:8023'}}
    table = manage_cli('instance', 'console', instance)
    assert table.code == 0 and 'tcp://192.0.2.1:8023' in table.out
    off = manage_cli('instance', 'console', instance, '--disable',
                     '--format', 'json').json()
    assert (off['console_enabled'], off['console_url']) == (False, None)
    assert ironic.console_calls == [(node_uuid(1), True)] * 2 + [
        (node_uuid(1), False)]


def test_console_acts_only_on_a_live_instance_s_own_node(
        instance, manage_cli, ironic):
    ironic.set_node(node_uuid(1), instance_uuid=instance_uuid(7))
    manage_cli('instance', 'console', instance).one_line_error(
        f'cannot enable the console of instance {instance}: node '
        f'{node_uuid(1)} serves {instance_uuid(7)} now')
    db_instances.request_delete(db_api.Context(), instance)
    manage_cli('instance', 'console', instance).one_line_error(
        'it is being deleted')
    manage_cli('instance', 'console', instance_uuid(9)).one_line_error(
        f'cannot enable the console of instance {instance_uuid(9)}: no such '
        'live instance')
    assert ironic.console_calls == []


def test_console_of_an_instance_without_a_node_is_refused(
        migrated_engine, manage_cli, ironic):
    service('cmp-1', node_uuid(1))
    db_instances.create(db_api.Context(), instance_uuid(2), 'web', 'cmp-1',
                        inst.RequestSpec('baremetal'), 'http://image')
    manage_cli('instance', 'console', instance_uuid(2)).one_line_error(
        'it is building; the console needs active or stopped or rescued')
    assert ironic.console_calls == []
