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

"""URL credentials are cut from Ironic's last_error before it is kept."""

import json

import pytest

from ironic_compute import exception
from ironic_compute import redaction
from ironic_compute.instances import answers
from ironic_compute.instances import provision
from tests.unit import fakes

SECRET = 's3cr3t'


@pytest.mark.parametrize('text, expected', [
    (f'Image http://glance:{SECRET}@10.0.0.1/x.qcow2 not found',
     'Image http://***@10.0.0.1/x.qcow2 not found'),
    (f'ipmi://root:{SECRET}@bmc-1 and redfish+https://admin:{SECRET}@bmc-2/x',
     'ipmi://***@bmc-1 and redfish+https://***@bmc-2/x'),
    # An unescaped "@" or "/" in the password is cut with it.
    (f'mysql+pymysql://u:{SECRET}@x/y@db.example/ic',
     'mysql+pymysql://***@db.example/ic'),
    (f"'https://user:{SECRET}@h/p' failed", "'https://***@h/p' failed"),
    (f'HTTP://:{SECRET}@H', 'HTTP://***@H'),
    # Nothing to cut.
    ('Timeout reached while waiting for callback for node n-1',
     'Timeout reached while waiting for callback for node n-1'),
    ('http://10.0.0.1:8080/x.qcow2 mail admin@example.com',
     'http://10.0.0.1:8080/x.qcow2 mail admin@example.com'),
    ('', ''),
    (None, None),
])
def test_url_credentials(text, expected):
    assert redaction.url_credentials(text) == expected


class LeakyBaremetal(fakes.FakeBaremetal):
    """Ironic whose last_error quotes a URL with its password."""

    error = f'Deploy failed: http://admin:{SECRET}@images.example/x.img: 401'

    def node_get(self, uuid, fields=None):
        record = super().node_get(uuid, fields)
        record.last_error = self.error
        return record


def test_the_provisioner_never_hands_on_a_password():
    node = fakes.make_node()
    ironic = LeakyBaremetal([node])
    ironic.deploy_fails = True
    provisioner = provision.Provisioner(ironic, poll_interval=0.01)
    assert SECRET not in provisioner.node(node.uuid).last_error
    ironic.allocations['a-1'] = fakes._Record(
        uuid='a-1', state='error', node_uuid=None, last_error=ironic.error)
    assert provisioner.allocation('a-1').last_error == (
        'Deploy failed: http://***@images.example/x.img: 401')
    # The fault a failed deploy leaves on the instance.
    provisioner.deploy(node.uuid, {'image_source': 'http://images.example/x.img', 'root_gb': '10'},
                       fence=lambda: None)
    with pytest.raises(exception.ProvisionError) as caught:
        provisioner.wait_for(node.uuid, answers.DEPLOY_DONE,
                             answers.DEPLOY_FAILED, 1, 'deploy')
    assert 'http://***@images.example/x.img' in str(caught.value)
    assert SECRET not in str(caught.value)


USER_DATA = '#cloud-config\npassword: "hunter2"\nchpasswd: {expire: false}\n'


@pytest.mark.parametrize('quote', [
    lambda secret: secret,
    lambda secret: json.dumps({'user_data': secret}),
    lambda secret: repr({'user_data': secret}),
    lambda secret: repr(secret),
], ids=['as-is', 'json', 'repr-of-dict', 'repr'])
def test_a_secret_quoted_in_an_error_is_hidden(quote):
    with pytest.raises(exception.ProvisionError) as caught:
        with redaction.secret_kept_out(USER_DATA):
            try:
                raise ValueError('the cause')
            except ValueError as cause:
                raise exception.ProvisionError(
                    f'Ironic refused {quote(USER_DATA)}') from cause
    assert type(caught.value) is exception.ProvisionError
    assert 'hunter2' not in str(caught.value)
    assert '***' in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_an_error_without_the_secret_or_with_no_secret_is_left_alone():
    for secret in (USER_DATA, None, ''):
        error = exception.ProvisionError('node n-1 is locked')
        with pytest.raises(exception.ProvisionError) as caught:
            with redaction.secret_kept_out(secret):
                raise error
        assert caught.value is error
