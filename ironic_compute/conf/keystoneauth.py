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

"""keystoneauth's options for a group that talks to an OpenStack service
([ironic], [placement]): its session, auth and adapter options, with the
group's own defaults, registered and listed the same way for each.

keystoneauth1.loading (and requests under it) is imported by the functions
that use it, not here: it costs a tenth of a second, which an
ironic-compute-manage command that talks to neither service (``instance
list``) does not pay (see ``register(client=False)``).
"""

import copy

from oslo_config import cfg


def register(conf, group, opts, defaults, client=True):
    """Register ``group`` (a cfg.OptGroup) with ``opts`` and, if ``client``,
    keystoneauth's options with ``defaults`` (see register_client).

    A fresh group each time: register_group() keeps the object it is given,
    and the auth plugin options loaded later would otherwise leak from one
    ConfigOpts into the next.
    """
    conf.register_group(cfg.OptGroup(group.name, title=group.title,
                                     help=group.help))
    conf.register_opts(opts, group=group.name)
    if client:
        register_client(conf, group.name, defaults)


def register_client(conf, group_name, defaults):
    """Register keystoneauth's session, auth and adapter options in the
    registered group ``group_name`` and set ``defaults`` ({option name:
    value}) on them: what a client of the service reads."""
    from keystoneauth1 import loading as ks_loading
    ks_loading.register_session_conf_options(conf, group_name)
    ks_loading.register_auth_conf_options(conf, group_name)
    ks_loading.register_adapter_conf_options(conf, group_name,
                                             include_deprecated=False)
    for name, value in defaults.items():
        conf.set_default(name, value, group=group_name)


def listed(group, opts, plugins, defaults):
    """Return {group: options} for the sample config: ``opts``, then
    keystoneauth's session, common auth, ``plugins``' and adapter options
    with ``defaults``, each name once (the plugins repeat some common
    options)."""
    from keystoneauth1 import loading as ks_loading
    ksa = ks_loading.get_session_conf_options() + (
        ks_loading.get_auth_common_conf_options())
    for plugin in plugins:
        ksa += ks_loading.get_auth_plugin_conf_options(plugin)
    ksa = copy.deepcopy(
        ksa + ks_loading.get_adapter_conf_options(include_deprecated=False))
    cfg.set_defaults(ksa, **defaults)
    seen = {}
    for opt in opts + ksa:
        seen.setdefault(opt.dest, opt)
    return {group: list(seen.values())}
