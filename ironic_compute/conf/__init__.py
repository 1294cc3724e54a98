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

"""Configuration: one module per option group.

Nothing is registered at import: an entry point (cmd/) or a test calls
:func:`register_opts` on the ConfigOpts it uses (``CONF`` in the
processes), as placement does.
"""

from oslo_config import cfg

from ironic_compute.conf import database
from ironic_compute.conf import default
from ironic_compute.conf import hash_ring
from ironic_compute.conf import instances
from ironic_compute.conf import ironic
from ironic_compute.conf import placement

CONF = cfg.CONF
MODULES = (default, database, hash_ring, instances, ironic, placement)
# The groups of a service the process may talk to, with keystoneauth's
# options (session, auth, adapter) on top of their own.
CLIENT_MODULES = (ironic, placement)


def register_opts(conf, clients=True):
    """Register every option of the service on ``conf``; keystoneauth's
    options of [ironic] and [placement] only if ``clients`` (see
    register_client_opts)."""
    for module in MODULES:
        if module in CLIENT_MODULES:
            module.register_opts(conf, client=clients)
        else:
            module.register_opts(conf)


def register_client_opts(conf):
    """Register keystoneauth's options of [ironic] and [placement], for a
    command that talks to Ironic or Placement. They load keystoneauth1 (a
    tenth of a second): ironic-compute-manage registers them only for the
    commands that read them."""
    for module in CLIENT_MODULES:
        module.register_client_opts(conf)
