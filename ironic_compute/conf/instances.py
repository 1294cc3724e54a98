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

"""[DEFAULT] options of the instance manager: builds, deletes, takeover."""

from oslo_config import cfg

opts = [
    cfg.IntOpt(
        'max_concurrent_builds',
        default=10,
        min=1,
        help='How many builds and deletes of instances this service runs at '
             'once, in a worker pool apart from the heartbeat and the '
             'resource tracker, so a slow deploy never delays either. More '
             'requests wait in the database until a worker is free.'),
    cfg.IntOpt(
        'max_concurrent_ironic_requests',
        default=2,
        min=1,
        help='How many requests to Ironic the instance workers of this '
             'service (builds, deletes, instance actions, the power calls '
             'of the power-state sync) have under way at once; the others '
             'wait their turn, and a call that changes something is fenced '
             'once its turn has come. While an instance action waits, '
             'the one listing at a time of the nodes the workers wait on is '
             'not counted. A '
             'burst of builds then never fills Ironic\'s API: the resource '
             'tracker\'s node listing (not counted here) is answered at '
             'once, and Ironic\'s deploys keep its CPU. Keep it plus one, '
             'times the services sharing one Ironic, well below the requests its API '
             'serves at once (10 per API process with Ironic\'s built-in '
             'server).'),
    cfg.IntOpt(
        'instance_takeover_grace',
        default=600,
        min=0,
        mutable=True,
        help='Seconds a service must have been down (crashed or stopped), '
             'after service_down_time, before the live services take over '
             'its instances and the builds and deletes queued for it: they '
             'move once it has been silent for service_down_time + this '
             'many seconds (a forced-down service: at once). Each instance '
             'goes to the service the hash ring gives its node to. A service '
             'that comes back does not take them back. 0 means never: the '
             'instances wait for their service. SIGHUP applies a new '
             'value.'),
    cfg.FloatOpt(
        'instance_poll_interval',
        default=0.2,
        min=0.1,
        mutable=True,
        help='Seconds between two reads of the builds, deletes and actions '
             'queued for this service in the database (one indexed query '
             'that usually finds nothing): a request waits half of it on '
             'average before its service picks it up. SIGHUP applies a new '
             'value.'),
    cfg.IntOpt(
        'shutdown_timeout',
        default=60,
        min=1,
        mutable=True,
        help='Seconds a soft power off or soft reboot (instance stop, '
             'instance reboot without --hard, and the power-state sync) may '
             'take before the service does it hard. Ironic refusing the '
             'soft action (a power interface without it) falls back to hard '
             'at once. SIGHUP applies a new value.'),
    cfg.IntOpt(
        'sync_power_state_interval',
        default=600,
        mutable=True,
        help='Seconds between two power-state syncs: each service reads the '
             'power state of its instances\' nodes with one Ironic listing '
             'and records it; an active instance found powered off becomes '
             'stopped, a stopped instance found powered on is powered off '
             'again. Instances with a task in flight and nodes in '
             'maintenance are skipped. 0 or less disables the sync. SIGHUP '
             'applies a new value.'),
    cfg.IntOpt(
        'sync_power_state_pool_size',
        default=5,
        min=1,
        help='How many power calls the power-state sync sends at once.'),
]


def register_opts(conf):
    conf.register_opts(opts)


def list_opts():
    return {'DEFAULT': opts}
