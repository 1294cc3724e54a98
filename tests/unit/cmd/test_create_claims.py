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

"""instance create with [placement]: the claim's project and user (the
request's, or [placement]claim_project_id / claim_user_id), and Placement
down is one line with nothing recorded; without [placement], no request."""

import json

import pytest

from ironic_compute.harness.fake_placement import FakePlacement
from ironic_compute.harness.fake_placement import Response
from ironic_compute.placement import client as placement_client
from tests.unit import fakes
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service
from tests.unit.cmd.test_manage_placement import PLACEMENT_CONF
from tests.unit.cmd.test_request_inputs import count_instances
from tests.unit.test_placement_claims import report

CREATE = ('instance', 'create', '--name', 'vm', '--resource-class',
          'baremetal', '--format', 'json')


@pytest.fixture
def placement(monkeypatch, migrated_engine):
    """The fake Placement the command talks to, holding the providers of
    cmp-1's two nodes."""
    fake = FakePlacement()
    real = placement_client.PlacementClient
    monkeypatch.setattr(placement_client, 'PlacementClient',
                        lambda conf, adapter=None: real(conf, adapter=fake))
    nodes = [node_uuid(1), node_uuid(2)]
    service('cmp-1', *nodes)
    report(fake, [fakes.make_node(uuid=u) for u in nodes])
    return fake


def test_the_claim_has_the_request_s_project_and_user(cli, placement):
    result = cli(*CREATE, '--project', 'demo', '--user', 'alice',
                 conf=PLACEMENT_CONF)
    assert result.code == 0, result.err
    shown = json.loads(result.out)
    assert placement.allocations == {
        shown['uuid']: {shown['node']: {'CUSTOM_BAREMETAL': 1}}}
    assert placement.owners[shown['uuid']] == ('demo', 'alice')


def test_without_project_and_user_the_claim_has_the_configured_ones(
        cli, placement):
    result = cli(*CREATE, conf=PLACEMENT_CONF)
    shown = json.loads(result.out)
    assert (shown['project_id'], shown['user_id']) == (None, None)
    assert placement.owners[shown['uuid']] == ('ironic-compute',
                                               'ironic-compute')
    result = cli(*CREATE, conf=PLACEMENT_CONF + 'claim_project_id = ops\n'
                 'claim_user_id = robot\n')
    assert placement.owners[json.loads(result.out)['uuid']] == ('ops',
                                                                 'robot')


def test_placement_down_is_one_line_and_nothing_recorded(cli, placement):
    placement.before = lambda method, path: Response(503)
    cli(*CREATE, conf=PLACEMENT_CONF).one_line_error('Placement: ',
                                                     'nothing recorded')
    assert count_instances() == 0


def test_without_placement_nothing_is_asked_of_it(cli, placement):
    sent = len(placement.requests)  # the providers' report
    result = cli(*CREATE)
    assert result.code == 0, result.err
    assert json.loads(result.out)['node'] is None  # its host picks it
    assert placement.requests[sent:] == []
