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

"""[placement] options: whether and how to report the nodes to Placement."""

from oslo_config import cfg

from ironic_compute.conf import keystoneauth

GROUP = cfg.OptGroup(
    'placement',
    title='Placement options',
    help='Optional. With an auth_type set, every node a service owns is '
         'reported to OpenStack Placement as a resource provider (inventory, '
         'traits, conductor group aggregate), as Nova reports them. Unset '
         '(the default), no request is ever sent to Placement. Keystone: '
         'auth_type = password and the usual options; a standalone '
         'Placement in noauth2 mode: auth_type = admin_token, endpoint = '
         'its URL, token = admin.')

SERVICE_TYPE = 'placement'
DEFAULT_INTERFACES = ['internal', 'public']
DEFAULT_TIMEOUT = 30

opts = [
    cfg.IntOpt(
        'refresh_interval',
        default=300,
        min=0,
        help='Seconds between two checks of the providers this service '
             'keeps against what Placement holds (one listing of the '
             'providers of its conductor groups: a provider changed or '
             'deleted by someone else is then read again and set right). '
             'Between checks a cycle in which no node changed sends no '
             'request to Placement. 0 never checks.'),
    cfg.StrOpt(
        'claim_project_id',
        default='ironic-compute',
        help='The project of the claim "instance create" makes in Placement '
             'for an instance asked for without --project (Placement '
             'records a project and a user with every allocation).'),
    cfg.StrOpt(
        'claim_user_id',
        default='ironic-compute',
        help='The user of the claim "instance create" makes in Placement '
             'for an instance asked for without --user.'),
]


_DEFAULTS = {'service_type': SERVICE_TYPE,
             'valid_interfaces': DEFAULT_INTERFACES,
             'timeout': DEFAULT_TIMEOUT}


def register_opts(conf, client=True):
    """Register the group's options; keystoneauth's too if ``client``."""
    keystoneauth.register(conf, GROUP, opts, _DEFAULTS, client=client)


def configured(conf):
    """Whether ``conf`` names a [placement] auth type: without one, no
    request is ever sent to Placement. False while keystoneauth's options
    are not registered (a command that talks to no service)."""
    group = GROUP.name
    return (group in conf and 'auth_type' in conf[group]
            and bool(conf[group].auth_type))


def auth_type_set(conf):
    """Whether the files and environment ``conf`` was parsed from set
    [placement]auth_type, read without registering keystoneauth's options
    (which import keystoneauth1): ``instance create`` registers them, and
    claims, only then. Reads the files again into a ConfigOpts of its own,
    holding that one option."""
    probe = cfg.ConfigOpts()
    probe.register_opt(cfg.StrOpt('auth_type', deprecated_name='auth_plugin'),
                       group=GROUP.name)
    argv = [arg for path in conf.config_file or ()
            for arg in ('--config-file', path)]
    if conf.config_dir:
        argv += ['--config-dir', conf.config_dir]
    probe(argv, project='ironic-compute', default_config_files=[],
          default_config_dirs=[])
    return bool(probe[GROUP.name].auth_type)


def register_client_opts(conf):
    """Register keystoneauth's options in the registered group."""
    keystoneauth.register_client(conf, GROUP.name, _DEFAULTS)


def list_opts():
    return keystoneauth.listed(GROUP, opts, ('password', 'admin_token'), _DEFAULTS)
