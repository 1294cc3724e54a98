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

"""instance stop / start / reboot / rebuild: the commands queue the action
on the row (one task at a time) and, with --wait, wait for its host."""

import datetime
import threading
import time

from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst
from tests.unit.cmd.test_instance_remove import built
from tests.unit.cmd.test_manage_admin import _services
from tests.unit.cmd.test_manage_admin import instance_uuid
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service


def test_each_command_queues_its_task_and_shows_it(migrated_engine, manage_cli):
    service('cmp-1', node_uuid(1))
    uuid = instance_uuid(1)
    built(uuid, 'cmp-1', node_uuid(1))
    shown = manage_cli('instance', 'reboot', '--hard', uuid,
                       '--format', 'json').json()
    assert (shown['task_state'], shown['vm_state']) == (inst.REBOOTING,
                                                        inst.ACTIVE)
    assert 'power_state' in shown and 'task_args' not in shown
    assert db_instances.get(db_api.Context(), uuid).args() == {'hard': True}
    manage_cli('instance', 'stop', uuid).one_line_error(
        f'cannot stop instance {uuid}: it has a task in flight: rebooting')
    manage_cli('instance', 'start', instance_uuid(9)).one_line_error(
        f'no instance {instance_uuid(9)}')


def test_rebuild_records_the_image_asked_for(migrated_engine, manage_cli):
    service('cmp-1', node_uuid(1))
    uuid = instance_uuid(1)
    built(uuid, 'cmp-1', node_uuid(1))
    manage_cli('instance', 'rebuild', uuid, '--image', 'http://img-2').ok()
    row = db_instances.get(db_api.Context(), uuid)
    assert row.task_state == inst.REBUILDING
    assert row.args() == {'image': 'http://img-2'}


def test_wait_returns_once_the_host_is_done_and_exits_1_on_a_fault(
        migrated_engine, manage_cli, monkeypatch):
    service('cmp-1', node_uuid(1))
    uuid = instance_uuid(1)
    built(uuid, 'cmp-1', node_uuid(1))
    from ironic_compute.cmd import manage_instance
    monkeypatch.setattr(manage_instance, 'WAIT_POLL', 0.01)

    def the_host_fails_it():
        row = db_instances.get(db_api.Context(), uuid)
        while row.task_state != inst.POWERING_OFF:
            time.sleep(0.01)
            row = db_instances.get(db_api.Context(), uuid)
        db_instances.transition(db_api.Context(), row, inst.POWERING_OFF,
                                task_state=None, fault='powering-off: no')
    host = threading.Thread(target=the_host_fails_it)
    host.start()
    result = manage_cli('instance', 'stop', uuid, '--wait', '--format',
                        'json')
    host.join(10)
    assert result.code == 1
    assert '"fault": "powering-off: no"' in result.out


def test_show_says_a_task_waits_for_a_takeover_and_since_when(
        migrated_engine, manage_cli):
    service('cmp-1', node_uuid(1))
    uuid = instance_uuid(1)
    built(uuid, 'cmp-1', node_uuid(1))
    manage_cli('instance', 'stop', uuid).ok()
    assert manage_cli('instance', 'show', uuid, '--format',
                      'json').json()['waiting'] is None
    with db_api.get_engine().begin() as conn:
        conn.execute(_services.update().values(
            last_seen_up=_utcnow() - datetime.timedelta(seconds=600)))
    waiting = manage_cli('instance', 'show', uuid, '--format',
                         'json').json()['waiting']
    requested = db_instances.get(db_api.Context(), uuid).task_requested_at
    assert waiting == (
        f'for a takeover since {requested.isoformat(sep=" ", timespec="seconds")}'
        ': its host cmp-1 is down (no heartbeat for 600 s)')


def test_a_rebuild_without_any_image_is_refused(migrated_engine, manage_cli):
    service('cmp-1', node_uuid(1))
    uuid = instance_uuid(1)
    built(uuid, 'cmp-1', node_uuid(1))
    from tests.unit.cmd.test_manage_admin import _instances
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == uuid)
                     .values(image_source=None))
    manage_cli('instance', 'rebuild', uuid).one_line_error(
        f'instance {uuid} has no image to rebuild with: pass --image URL')
    assert db_instances.get(db_api.Context(), uuid).task_state is None
