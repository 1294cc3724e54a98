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

CONF = cfg.CONF
MODULES = (default, database, hash_ring, instances, ironic)


def register_opts(conf):
    """Register every option of the service on ``conf``."""
    for module in MODULES:
        module.register_opts(conf)
