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

"""The config drive, on SQLite, MariaDB and PostgreSQL, against the fake
Ironic: what reaches Ironic with the deploy and every rebuild, a rebuild
that replaces the user data and the SSH keys (sent once, also after a
kill), a takeover that keeps it all, and user data in no log, repr or
error. The checks of what a tenant gives are at the end."""

import base64
import hashlib
import json
import logging
import re
import struct

import pytest

from ironic_compute import exception
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import build
from ironic_compute.instances import configdrive
from ironic_compute.instances import model as inst
from tests.unit.instance_cloud import claim
from tests.unit.instance_cloud import ctx
from tests.unit.instance_cloud import take_over
from tests.unit.test_rescue import ask
from tests.unit.test_rescue import carry_out
from tests.unit.test_rescue import killed

# A marker no log line may hold.
SECRET = '#cloud-config\npassword: MARKER-4f1d "quoted" \u00e9t\u00e9\n'
UUID = '00000000-0000-0000-0000-000000000001'


def public_key(kind='ssh-ed25519', comment='alice@example.com'):
    """A well-formed public key line of ``kind``."""
    name = kind.encode()
    blob = struct.pack('>I', len(name)) + name + struct.pack('>I', 32) + (
        b'\x01' * 32)
    return f'{kind} {base64.b64encode(blob).decode()} {comment}'.strip()


KEY_A, KEY_B = public_key(), public_key('ssh-rsa', 'bob@example.com')
NETWORK = {'links': [{'id': 'eth0', 'type': 'phy',
                      'ethernet_mac_address': '52:54:00:12:34:56'}],
           'networks': [{'id': 'net0', 'link': 'eth0', 'type': 'ipv4_dhcp'}],
           'services': []}
DRIVE = configdrive.ConfigDrive(
    ssh_keys=(KEY_A,), user_data=SECRET, meta=(('role', 'web'),),
    network_data=NETWORK, hostname='web-1.example.com')


def built_with(cloud, drive=DRIVE, host='a'):
    """An instance ``host`` built with ``drive``: active."""
    row = claim(db_instances.create(
        ctx(), UUID, 'vm', host, inst.RequestSpec(resource_class='baremetal'),
        'http://img', **drive.columns()))
    cloud.managers[host]._run(row.uuid, build.build, row)
    row = db_instances.get(ctx(), row.uuid)
    assert (row.vm_state, row.task_state) == (inst.ACTIVE, None), row
    return row


def sent(cloud):
    """Every (target, configdrive) Ironic was sent."""
    return [(target, drive) for _node, target, drive
            in cloud.ironic.configdrives]


EXPECTED = {
    'meta_data': {'uuid': UUID, 'name': 'vm', 'hostname': 'web-1.example.com',
                  'public_keys': {'key-1': KEY_A}, 'meta': {'role': 'web'}},
    'user_data': SECRET, 'network_data': NETWORK}


# --- what reaches Ironic ------------------------------------------------------------

def test_the_deploy_sends_the_whole_config_drive(cloud):
    row = built_with(cloud)
    assert sent(cloud) == [('active', EXPECTED)]
    assert row.config_drive() == DRIVE
    # Ironic's API takes these keys only (its _CONFIG_DRIVE_SCHEMA).
    assert set(EXPECTED) <= {'meta_data', 'user_data', 'network_data',
                             'vendor_data'}


def test_a_build_without_any_sends_no_config_drive(cloud):
    built_with(cloud, configdrive.ConfigDrive())
    assert sent(cloud) == []
    assert cloud.ironic.provision_calls[-1][1] == 'active'


def test_a_rebuild_sends_the_same_config_drive_again(cloud):
    row = built_with(cloud)
    ask(row, 'rebuild')
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.ACTIVE, None, None)
    assert sent(cloud) == [('active', EXPECTED), ('rebuild', EXPECTED)]


def test_a_rebuild_replaces_the_user_data_and_the_keys(cloud):
    row = built_with(cloud)
    ask(row, 'rebuild', **configdrive.rebuild_request(
        user_data='#!/bin/sh\necho new\n', ssh_keys=[KEY_B]))
    done = carry_out(cloud, row)
    assert done.fault is None and done.task_args is None
    want = json.loads(json.dumps(EXPECTED))
    want['user_data'] = '#!/bin/sh\necho new\n'
    want['meta_data']['public_keys'] = {'key-1': KEY_B}
    assert sent(cloud)[-1] == ('rebuild', want)
    assert done.config_drive() == configdrive.ConfigDrive(
        ssh_keys=(KEY_B,), user_data='#!/bin/sh\necho new\n',
        meta=DRIVE.meta, network_data=NETWORK, hostname=DRIVE.hostname)
    # The next rebuild sends what the last one recorded.
    ask(done, 'rebuild')
    carry_out(cloud, done)
    assert sent(cloud)[-1] == ('rebuild', want)


def test_an_empty_user_data_drops_it(cloud):
    row = built_with(cloud)
    ask(row, 'rebuild', **configdrive.rebuild_request(user_data=''))
    done = carry_out(cloud, row)
    assert done.user_data is None
    assert 'user_data' not in sent(cloud)[-1][1]
    assert sent(cloud)[-1][1]['meta_data']['public_keys'] == {'key-1': KEY_A}


def test_a_rebuild_killed_after_its_call_is_not_sent_again(cloud):
    row = built_with(cloud)
    ask(row, 'rebuild', **configdrive.rebuild_request(user_data='new'))
    cloud.managers['a'].provisioner.wait_for = killed
    carry_out(cloud, row)
    # Killed while it waited: the new user data is on the row already.
    assert db_instances.get(ctx(), row.uuid).user_data == 'new'
    del cloud.managers['a'].provisioner.wait_for
    done = carry_out(cloud, row)
    assert (done.vm_state, done.task_state) == (inst.ACTIVE, None)
    assert [target for target, _ in sent(cloud)] == ['active', 'rebuild']
    assert sent(cloud)[-1][1]['user_data'] == 'new'


def test_a_takeover_keeps_the_config_drive(cloud):
    row = built_with(cloud)
    taken = take_over(row.uuid, 'a', 'b', cloud)
    assert taken.config_drive() == DRIVE
    ask(taken, 'rebuild')
    done = carry_out(cloud, taken, 'b')
    assert (done.host, done.vm_state, done.fault) == ('b', inst.ACTIVE, None)
    assert sent(cloud) == [('active', EXPECTED), ('rebuild', EXPECTED)]


def test_a_rebuild_asked_before_a_takeover_is_sent_by_the_successor(cloud):
    row = built_with(cloud)
    ask(row, 'rebuild', **configdrive.rebuild_request(ssh_keys=[KEY_B]))
    taken = take_over(row.uuid, 'a', 'b', cloud)
    done = carry_out(cloud, taken, 'b')
    assert done.fault is None
    assert sent(cloud)[-1][1]['meta_data']['public_keys'] == {'key-1': KEY_B}
    assert sent(cloud)[-1][1]['user_data'] == SECRET


# --- user data: a secret ----------------------------------------------------------

def test_user_data_is_never_logged_nor_in_the_row_s_repr(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    row = built_with(cloud)
    ask(row, 'rebuild', **configdrive.rebuild_request(user_data=SECRET * 2))
    queued = db_instances.get(ctx(), row.uuid)
    cloud.ironic.unavailable = True  # paused: logged with its error
    carry_out(cloud, queued)
    cloud.ironic.unavailable = False
    carry_out(cloud, queued)
    for text in (caplog.text, repr(queued), repr(queued.config_drive())):
        assert 'MARKER-4f1d' not in text
    assert 'rebuilding' in caplog.text


def rebuild_refused_quoting(cloud, drive=DRIVE):
    """A rebuild carried out on an instance built with ``drive``, Ironic
    refusing it with an error that quotes the config drive it was sent
    (JSON): the row at its end."""
    from ironicclient import exc as ironic_exc
    row = built_with(cloud, drive)
    real = cloud.ironic.node_set_provision_state

    def refuses(uuid, target, configdrive=None, **kwargs):
        if target == 'rebuild':
            raise ironic_exc.BadRequest(
                f'Invalid configdrive format: {json.dumps(configdrive)}')
        return real(uuid, target, configdrive=configdrive, **kwargs)
    cloud.ironic.node_set_provision_state = refuses
    ask(row, 'rebuild')
    return carry_out(cloud, row)


def test_an_error_quoting_the_user_data_is_scrubbed(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    done = rebuild_refused_quoting(cloud)
    assert done.fault.startswith('rebuilding: cannot rebuild')
    assert '***' in done.fault
    assert 'MARKER-4f1d' not in done.fault + caplog.text


def test_keystoneauth_s_debug_line_of_a_deploy_keeps_no_body(caplog):
    from ironic_compute import ironic  # noqa: F401 - installs the filter
    caplog.set_level(logging.DEBUG, logger='keystoneauth')
    body = json.dumps({'target': 'active', 'configdrive': EXPECTED})
    for name in ('keystoneauth.session', 'keystoneauth.session.request'):
        logging.getLogger(name).debug(
            "REQ: curl -g -i -X PUT http://ironic/v1/nodes/n/states/provision "
            "-d '%s'", body)
    assert 'MARKER-4f1d' not in caplog.text
    assert caplog.text.count('(body not logged: it holds a config drive)') == 2


def test_the_public_view_is_the_size_and_digest(cloud):
    row = built_with(cloud)
    shown = row.as_dict()
    raw = SECRET.encode()
    assert shown['user_data'] == {'size': len(raw),
                                  'sha256': hashlib.sha256(raw).hexdigest()}
    assert (shown['ssh_keys'], shown['meta'], shown['network_data'],
            shown['hostname']) == ([KEY_A], {'role': 'web'}, NETWORK,
                                   'web-1.example.com')
    assert 'MARKER-4f1d' not in json.dumps(shown, default=str)


# --- what a tenant gives ------------------------------------------------------------

@pytest.mark.parametrize('kind', configdrive.KEY_TYPES)
def test_every_public_key_type_is_taken(kind):
    key = public_key(kind, '')
    assert configdrive.public_keys(f'# mine\n\n{key}\n', 'f') == [key]


@pytest.mark.parametrize('text, why', [
    ('', 'f holds no SSH public key'),
    ('-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n',
     'f holds a private key: give the public one (.pub)'),
    ('ssh-ed25519', 'f line 1 is not an SSH public key'),
    ('ssh-ed25519 not-base64!', 'f line 1 is not an SSH public key'),
    ('ssh-foo ' + public_key().split()[1], 'f line 1 is not an SSH public'),
    # The body names another type than the line.
    (f'ssh-rsa {public_key().split()[1]}', 'f line 1 is not an SSH public'),
    (f'{public_key()}\nhello', 'f line 2 is not an SSH public key'),
])
def test_what_is_not_a_public_key_is_refused(text, why):
    with pytest.raises(exception.InvalidRequest, match='^' + re.escape(why)):
        configdrive.public_keys(text, 'f')


@pytest.mark.parametrize('name', ['web-1', 'a.b.c', 'x' * 63, 'A1'])
def test_rfc_1123_host_names_are_taken(name):
    assert configdrive.check_hostname(name) == name


@pytest.mark.parametrize('name', ['-web', 'web-', 'a..b', 'under_score',
                                  'x' * 64, ('a' * 60 + '.') * 5, 'sp ace',
                                  'caf\u00e9'])
def test_other_host_names_are_refused(name):
    with pytest.raises(exception.InvalidRequest, match='invalid hostname'):
        configdrive.check_hostname(name)


@pytest.mark.parametrize('items, why', [
    (['role'], "invalid --meta 'role': use KEY=VALUE"),
    (['=web'], "invalid --meta '=web': use KEY=VALUE"),
    (['k=' + 'v' * 256], 'up to 255 characters'),
    (['a=1', 'a=2'], "--meta a given twice: '1' and '2'"),
])
def test_bad_meta_is_refused(items, why):
    with pytest.raises(exception.InvalidRequest, match=why):
        configdrive.parse_meta(items)


def test_meta_values_may_hold_equals_signs():
    assert configdrive.parse_meta(['a=b=c', 'a=b=c']) == {'a': 'b=c'}


@pytest.mark.parametrize('text, why', [
    ('{', 'f is not valid JSON: '), ('[1]', 'f is not a JSON object')])
def test_bad_network_data_is_refused(text, why):
    with pytest.raises(exception.InvalidRequest, match=why):
        configdrive.network_data(text, 'f')


def test_user_data_must_be_text_and_is_never_quoted():
    with pytest.raises(exception.InvalidRequest) as caught:
        configdrive.user_data(b'MARKER\xff', 'f')
    assert str(caught.value) == ('f is not UTF-8 text (Ironic takes user '
                                 'data as text)')
    assert configdrive.user_data(b'', 'f') is None


def test_a_drive_larger_than_ironic_takes_is_refused():
    fits = configdrive.ConfigDrive(user_data='x' * (configdrive.MAX_BYTES
                                                    - 200))
    assert fits.check_size(UUID, 'vm') <= configdrive.MAX_BYTES
    too_big = configdrive.ConfigDrive(user_data='\n' * (
        configdrive.MAX_BYTES // 2 + 1))  # each "\n" is 2 bytes as JSON
    with pytest.raises(exception.InvalidRequest) as caught:
        too_big.check_size(UUID, 'vm')
    assert str(caught.value).endswith(
        'more than Ironic takes (64 MiB: its API refuses a larger provision '
        'request)')
