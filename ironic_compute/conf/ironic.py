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

"""[ironic] options: how to reach Ironic and which of its nodes are ours."""

from oslo_config import cfg

from ironic_compute.conf import keystoneauth

GROUP = cfg.OptGroup(
    'ironic',
    title='Ironic options',
    help='How to reach the Ironic API (keystoneauth session, auth and '
         'adapter options, service type "baremetal") and which of its nodes '
         'this service shares with its peers.')

SERVICE_TYPE = 'baremetal'
DEFAULT_INTERFACES = ['internal', 'public']
DEFAULT_TIMEOUT = 30
# Ironic's own rule for conductor group names.
PARTITION_KEY_REGEX = r'^[a-zA-Z0-9_.-]*$'

opts = [
    cfg.StrOpt(
        'partition_key',
        regex=PARTITION_KEY_REGEX,
        max_length=255,
        mutable=True,
        deprecated_opts=[cfg.DeprecatedOpt('conductor_group', group='ironic')],
        help='Manage only the Ironic nodes of this conductor group. Unset '
             'means every node, whatever its group. Also accepted under its '
             'later name conductor_group. SIGHUP applies a new value without '
             'a restart.'),
    cfg.ListOpt(
        'peer_list',
        default=[],
        mutable=True,
        help='With partition_key set: the services (host names) that manage '
             'the same conductor group. The ring is built over the live '
             'services of this list, which must contain this host. Ignored, '
             'with a warning, when partition_key is unset. SIGHUP applies a '
             'new value without a restart.'),
    cfg.StrOpt(
        'shard',
        help='Manage only the Ironic nodes of this shard (Ironic API 1.82 or '
             'later). Unset means nodes of any shard.'),
    cfg.BoolOpt(
        'shard_ring',
        default=False,
        mutable=True,
        help='List only the nodes of the Ironic shards assigned to this '
             'service (Ironic API 1.82 or later) instead of the whole '
             'partition: the shards are assigned to the live peers by '
             'consistent hashing with bounded loads, weighted by their node '
             'count, and the nodes without a shard go to one of them. Takes '
             'effect only when every live peer of the partition runs it; '
             'until then every service lists the whole partition. Turn it on '
             'service by service with SIGHUP after "ironic-compute-manage '
             'ironic shard-assign". See doc/scaling.md.'),
    cfg.IntOpt(
        'api_max_retries',
        default=3,
        min=0,
        help='How many times a request to Ironic is retried when Ironic '
             'answers 409 Conflict or 503 Service Unavailable, or cannot be '
             'reached. 0 disables retries. After the last try the cycle is '
             'skipped and no compute_nodes row changes.'),
    cfg.IntOpt(
        'deploy_timeout',
        default=1800,
        min=1,
        mutable=True,
        help='Seconds a build waits for its node to become active before '
             'the instance goes to error and the node is released; and how '
             'long a delete or a release waits for the node to become '
             'available again (cleaning included) before it tries again '
             'later.'),
    cfg.IntOpt(
        'api_retry_interval',
        default=2,
        min=0,
        help='Seconds to wait before the first retry of a request to Ironic '
             '(409, 503, connection errors); each further retry waits twice '
             'as long, up to 8 times this value, and every wait is a random '
             'time between half of it and all of it. 0 retries at once.'),
]


_DEFAULTS = {'service_type': SERVICE_TYPE,
             'valid_interfaces': DEFAULT_INTERFACES,
             'timeout': DEFAULT_TIMEOUT}


def register_opts(conf, client=True):
    """Register the group's options; keystoneauth's too if ``client``."""
    keystoneauth.register(conf, GROUP, opts, _DEFAULTS, client=client)


def register_client_opts(conf):
    """Register keystoneauth's options in the registered group."""
    keystoneauth.register_client(conf, GROUP.name, _DEFAULTS)


def list_opts():
    return keystoneauth.listed(GROUP, opts, ('password',), _DEFAULTS)
