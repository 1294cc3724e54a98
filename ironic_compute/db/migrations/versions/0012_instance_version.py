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

"""A version per instance row, bumped by every write.

``instances.version`` changes with every transition, action request,
takeover, move and power record. An observer (the power-state sync) writes
only while the row still has the version it read: a row that went away from
the values it saw and came back to them (a reboot made during the sync's
pass: active, rebooting, active) has another version, so the sync's stale
view matches nothing. ``generation`` still names the managing host's claim.
"""

import sqlalchemy as sa

from ironic_compute.db.migration_ops import add_columns

revision = '0012'
down_revision = '0011'
# A defaulted column: a service of the previous release runs on this schema
# (its writes do not bump the version; the sync of this release then only
# misses the change that release made, as that release itself would).
expand_only = True


def upgrade():
    add_columns('instances', sa.Column('version', sa.Integer,
                                       nullable=False, server_default='0'))
