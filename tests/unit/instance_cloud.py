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

"""Two services (a, b) sharing a fake Ironic, with an instance manager
each; the tests run its flows (manager._run(key, flow, row): build.build,
power.reboot...) directly, at the moment they choose: the fencing and the
instance-action tests stand on it."""

import dataclasses
import datetime

from oslo_config import cfg

from ironic_compute import conf as ic_conf
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.db import takeover as db_takeover
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import build
from ironic_compute.instances import manager as instance_manager
from ironic_compute.instances import model as inst
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes

SDT, GRACE = 6, 30
_services = models.services


def ctx():
    return db_api.Context()


def make_conf():
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    conf([], project='ironic-compute', default_config_files=[])
    conf.set_override('deploy_timeout', 2, group='ironic')
    conf.set_override('service_down_time', SDT)
    conf.set_override('instance_takeover_grace', GRACE)
    conf.set_override('shutdown_timeout', 1)
    return conf


@dataclasses.dataclass
class Cloud:
    conf: cfg.ConfigOpts
    ironic: fakes.FakeBaremetal
    ids: dict
    managers: dict

    def node(self):
        return next(iter(self.ironic.nodes))


def make_cloud():
    """Services a and b, each holding its share of two fake nodes."""
    conf = make_conf()
    ironic = fakes.FakeBaremetal([fakes.make_node(), fakes.make_node()])
    ids = {h: db_services.register(ctx(), h) for h in 'ab'}
    for host in 'ab':
        resource_tracker.ResourceTracker(host, ids[host], ironic).run_cycle(
            resource_tracker.Settings(partition_exponent=8))
    managers = {}
    for host in 'ab':
        manager = instance_manager.InstanceManager(
            conf, host, ironic, ids[host], lease=fakes.valid_lease())
        manager.provisioner.poll_interval = 0.01
        manager.provisioner.poll_cap = 0.05
        managers[host] = manager
    return Cloud(conf, ironic, ids, managers)


def request(host, uuid_suffix=1):
    uuid = f'00000000-0000-0000-0000-{uuid_suffix:012d}'
    return db_instances.create(ctx(), uuid, 'vm', host,
                               inst.RequestSpec(resource_class='baremetal'),
                               'http://img')


def claim(row):
    """What a worker holds once it claimed the build (spawning)."""
    claimed = db_instances.transition(ctx(), row, inst.SCHEDULED,
                                      task_state=inst.SPAWNING)
    assert claimed is not None and claimed.task_state == inst.SPAWNING
    return claimed


def built(cloud, host='a', uuid_suffix=1):
    """An instance ``host`` built: active, its node deployed and on."""
    row = claim(request(host, uuid_suffix))
    manager = cloud.managers[host]
    manager._run(row.uuid, build.build, row)
    row = db_instances.get(ctx(), row.uuid)
    assert (row.vm_state, row.task_state) == (inst.ACTIVE, None), row
    return row


def set_service(host, **values):
    with db_api.get_engine().begin() as conn:
        conn.execute(_services.update().where(_services.c.host == host)
                     .values(**values))


def silence(host, seconds):
    set_service(host, last_seen_up=_utcnow()
                - datetime.timedelta(seconds=seconds))


def take_over(uuid, dead, new, cloud):
    """``new`` takes the instance over from ``dead``, silent long enough."""
    silence(dead, SDT + GRACE + 5)
    seen = next(r for r in db_takeover.of_hosts(ctx(), [dead])
                if r.uuid == uuid)
    assert db_takeover.take_over(ctx(), seen, new, cloud.ids[new],
                                 SDT + GRACE)
    row = db_instances.get(ctx(), uuid)
    assert row.host == new
    return row


def allocate(cloud, uuid, node):
    """An allocation named ``uuid`` on ``node``, as Ironic makes one."""
    cloud.ironic.allocation.create(uuid=uuid, name=uuid,
                                   resource_class='baremetal', traits=None,
                                   candidate_nodes=[node])
    return cloud.ironic.allocations[uuid]
