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

"""[DEFAULT] options of the service itself."""

import socket

from oslo_config import cfg
from oslo_service import _options as service_options

service_opts = [
    cfg.StrOpt(
        'host',
        default=socket.gethostname(),
        sample_default='<current_hostname>',
        help='Name of this compute service. It must be unique among the '
             'services that share one Ironic; names are compared without '
             'regard to case. It is the name other services see in the hash '
             'ring and the owner recorded on compute_nodes rows.'),
    cfg.StrOpt(
        'state_path',
        default='/var/lib/ironic-compute',
        help='Directory where the service keeps its state, such as the '
             'embedded SQLite database of the default [database]connection.'),
    cfg.IntOpt(
        'report_interval',
        default=10,
        min=1,
        help='Seconds between two heartbeats of this service to the '
             'database. Must be smaller than service_down_time.'),
    cfg.IntOpt(
        'service_down_time',
        default=60,
        min=1,
        help='Seconds without a heartbeat after which a service is '
             'considered down and its nodes are taken over by its peers. '
             'Must be larger than report_interval.'),
    cfg.IntOpt(
        'update_resources_interval',
        default=60,
        min=1,
        mutable=True,
        help='Seconds between two resource tracker cycles (rebuild the ring, '
             'list the Ironic nodes, sync the compute_nodes rows). SIGHUP '
             'applies a new value without a restart.'),
    cfg.IntOpt(
        'loop_stuck_timeout',
        default=900,
        min=1,
        help='Seconds after which a resource tracker cycle or a heartbeat '
             'that has not returned counts as stuck. While no loop is stuck '
             'the service sends WATCHDOG=1 to systemd, whatever Ironic and '
             'the database do; a stuck or dead loop stops the pings, and '
             'systemd restarts the service after WatchdogSec. Must exceed '
             'the longest legitimate cycle (a full Ironic listing with its '
             'retries).'),
]


def _graceful_shutdown_opts():
    # Take the option exactly as oslo.service defines it so that the
    # launcher and our own shutdown code read the same value.
    return [o for o in service_options.service_opts
            if o.name == 'graceful_shutdown_timeout']


def register_opts(conf):
    conf.register_opts(service_opts)
    conf.register_opts(_graceful_shutdown_opts())


def list_opts():
    return {'DEFAULT': service_opts + _graceful_shutdown_opts()}
