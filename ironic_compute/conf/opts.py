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

"""Entry points for oslo-config-generator."""

from ironic_compute.conf import database
from ironic_compute.conf import default
from ironic_compute.conf import hash_ring
from ironic_compute.conf import instances
from ironic_compute.conf import ironic
from ironic_compute.conf import placement
from ironic_compute.conf import reports


def list_opts():
    """(group, options) pairs, from the modules' {group: options}."""
    groups = {}
    for module in (default, instances, hash_ring, ironic, placement, database,
                   reports):
        for group, options in module.list_opts().items():
            groups.setdefault(group, []).extend(options)
    return list(groups.items())

