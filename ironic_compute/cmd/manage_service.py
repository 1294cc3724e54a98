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

"""ironic-compute-manage service ...: the services and their state."""

from ironic_compute import exception
from ironic_compute.cluster import liveness
from ironic_compute.cmd import common
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services
from ironic_compute.nodes import ownership

CONF = common.CONF
REASON_MAX = 255  # services.disabled_reason is a String(255)


_ago = output.optional('{:.0f} s ago')
_seconds = output.optional('{:.2f}')


COLUMNS = output.columns(
    ('host', 'Host'), ('state', 'State'), ('reason', 'Why down'), ('nodes', 'Nodes'),
    ('heartbeat_age_seconds', 'Last heartbeat', _ago), ('last_cycle_at', 'Last cycle (UTC)'),
    ('last_cycle_seconds', 'Cycle (s)', _seconds), ('disabled_reason', 'Disabled reason'))


def entry(row, now, service_down_time):
    """One services.ServiceRow as the dict of a listing."""
    why = liveness.down_reason(row.record(), now,
                                service_down_time)
    age = None
    if row.last_seen_up is not None:
        age = round((now - row.last_seen_up).total_seconds(), 1)
    return {
        'host': row.host,
        'id': row.id,
        'state': 'up' if why is None else 'down',
        'reason': why,
        'nodes': row.node_count,
        'disabled': row.disabled,
        'disabled_reason': row.disabled_reason,
        'forced_down': row.forced_down,
        'stopped_at': row.stopped_at,
        'last_seen_up': row.last_seen_up,
        'heartbeat_age_seconds': age,
        'last_cycle_at': row.last_cycle_at,
        'last_cycle_seconds': row.last_cycle_seconds,
    }


def normalize(host):
    name = ownership.normalize_host(host)
    if not name:
        raise exception.CommandError('the host name is empty')
    return name


class ServiceCommands:
    """The ironic-compute services: state, nodes, disable, force down."""

    @format_option
    def list(self, format):
        """List the services: up or down and why, nodes, last cycle."""
        # Judged on the database's clock, like the services judge each other.
        listing = db_services.load_services(db_api.Context())
        rows, now = listing.rows, listing.now
        output.show_listing(
            [entry(r, now, CONF.service_down_time) for r in rows],
            COLUMNS, format)

    @args('host', help='host name of the service')
    @args('--reason', help='why, shown by "service list" (at most 255 '
                           'characters)')
    def disable(self, host, reason=None):
        """Disable a service: its peers no longer count it in the ring."""
        host = normalize(host)
        if reason is not None and len(reason) > REASON_MAX:
            raise exception.CommandError(
                f'the reason is longer than {REASON_MAX} characters')
        admin.update_service(db_api.Context(), host, disabled=True,
                             disabled_reason=reason)
        print(f'Service {host} disabled'
              + (f': {reason}' if reason else '') + '.')

    @args('host', help='host name of the service')
    def enable(self, host):
        """Let a disabled service take part in the ring again."""
        host = normalize(host)
        admin.update_service(db_api.Context(), host, disabled=False,
                             disabled_reason=None)
        print(f'Service {host} enabled.')

    @args('host', help='host name of the service')
    def force_down(self, host):
        """Mark a service down at once, without waiting service_down_time."""
        host = normalize(host)
        admin.update_service(db_api.Context(), host, forced_down=True)
        print(f'Service {host} forced down.')

    @args('host', help='host name of the service')
    def unset_force_down(self, host):
        """Clear the forced-down mark: the heartbeat decides again."""
        host = normalize(host)
        admin.update_service(db_api.Context(), host, forced_down=False)
        print(f'Service {host} no longer forced down.')
