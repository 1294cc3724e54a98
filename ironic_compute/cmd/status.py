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

"""ironic-compute-status upgrade check: is this deployment fit to run?

The OpenStack convention (``nova-status``, ``ironic-status``): operators
run it before and after an upgrade. Exit codes are oslo.upgradecheck's:
0 success, 1 warning, 2 failure, 255 the command itself failed (such as a
configuration it cannot use: one line, as the other commands say it).
"""

import functools
import sys

from oslo_upgradecheck import upgradecheck

from ironic_compute import ironic
from ironic_compute.cluster import liveness
from ironic_compute.cmd import common
from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from ironic_compute.db import services as db_services
from ironic_compute.placement import client as placement_client
from ironic_compute.ring import agreement

CONF = common.CONF
PROG = 'ironic-compute-status'
# oslo.upgradecheck's exit code for "the command itself failed".
COMMAND_FAILED = 255
Code = upgradecheck.Code
Result = upgradecheck.Result
# What this release asks of Ironic: allocations for builds (1.52), and the
# filters the configuration uses.
NEEDED_API = {'instances (allocations)': ironic.ALLOCATION_API}


def _one_line_failure(check):
    """A check that raises reports a failure in one line, not a traceback."""
    @functools.wraps(check)
    def wrapper(self):
        try:
            return check(self)
        except Exception as exc:  # noqa: BLE001 - reported as the result
            return Result(Code.FAILURE, common.driver_message(exc))
    return wrapper


class Checks(upgradecheck.UpgradeCommands):

    @_one_line_failure
    def _check_schema(self):
        verdict = migration.verdict()
        code = {'current': Code.SUCCESS, 'newer': Code.WARNING}.get(
            verdict.state, Code.FAILURE)
        return Result(code, verdict.message())

    @_one_line_failure
    def _check_heartbeats(self):
        listing = db_services.load_services(db_api.Context(),
                                            count_nodes=False)
        if not listing.rows:
            return Result(Code.WARNING, 'no ironic-compute service has '
                                        'registered yet')
        # Disabled and stopped services are an operator's choice, not a
        # failure: counted apart, never as running.
        apart = {'disabled': [], 'stopped': []}
        down = {}
        running = 0
        for row in listing.rows:
            if row.disabled:
                apart['disabled'].append(row.host)
                continue
            if row.stopped_at is not None:
                apart['stopped'].append(row.host)
                continue
            running += 1
            why = liveness.down_reason(row.record(), listing.now,
                                        CONF.service_down_time)
            if why is not None:
                down[row.host] = why
        aside = ''.join(f'; {what}: {", ".join(sorted(hosts))}'
                        for what, hosts in apart.items() if hosts)
        if not running:
            return Result(Code.WARNING, 'no ironic-compute service is '
                                        'running' + aside)
        if down:
            what = '; '.join(f'{h}: {w}' for h, w in sorted(down.items()))
            return Result(Code.WARNING,
                          f'{running - len(down)} of {running} running '
                          f'services heartbeat; down: {what}{aside}')
        return Result(Code.SUCCESS,
                      f'all {running} running services heartbeat{aside}')

    @_one_line_failure
    def _check_partitions(self):
        listing = db_services.load_services(db_api.Context(),
                                            count_nodes=False)
        live = [(row.host, (row.partition_key, row.shard), row.ring_settings)
                for row in listing.rows
                if liveness.is_up(row.record(), listing.now,
                                   CONF.service_down_time)]
        found = agreement.partition_disagreements(live)
        if not found:
            return Result(Code.SUCCESS, f'the {len(live)} live services of '
                                        'each partition agree on the ring')
        parts = []
        for (key, shard), hosts in sorted(found.items(),
                                          key=lambda kv: str(kv[0])):
            reference = next(h for h, w in hosts.items() if w == 'reference')
            name = key or '(all nodes)'
            if shard:
                name += f' shard {shard}'
            parts += [f'partition {name}: {host} differs from {reference} '
                      f'in {what}' for host, what in hosts.items()
                      if what != 'reference']
        return Result(Code.FAILURE, '; '.join(parts))

    @_one_line_failure
    def _check_ironic(self):
        if not CONF.ironic.auth_type:
            return Result(Code.WARNING, '[ironic] is not configured here: '
                                        'not checked')
        client = ironic.IronicClient(CONF)
        version = ironic.parse_version(client.api().current_api_version)
        needed = dict(NEEDED_API)
        if CONF.ironic.partition_key:
            needed['[ironic]partition_key'] = ironic.GROUP_API
        if CONF.ironic.shard:
            needed['[ironic]shard'] = ironic.SHARD_API
        elif CONF.ironic.shard_ring:
            needed['[ironic]shard_ring'] = ironic.SHARD_API
        missing = [f'{what} needs {major}.{minor}'
                   for what, (major, minor) in needed.items()
                   if version < (major, minor)]
        shown = f'{version[0]}.{version[1]}'
        if missing:
            return Result(Code.FAILURE, f'Ironic answers with API {shown}: '
                                        + '; '.join(missing))
        return Result(Code.SUCCESS, f'Ironic answers with API {shown}')

    @_one_line_failure
    def _check_placement(self):
        if not placement_client.configured(CONF):
            return Result(Code.SUCCESS, '[placement] is not configured: no '
                                        'provider is reported (optional)')
        client = placement_client.PlacementClient(CONF)
        served = client.max_microversion()
        needed = ironic.parse_version(placement_client.MICROVERSION)
        shown = f'{served[0]}.{served[1]}'
        if served < needed:
            return Result(Code.FAILURE, f'Placement serves microversions up '
                                        f'to {shown}; this release needs '
                                        f'{placement_client.MICROVERSION}')
        # GET / answers without credentials: a listing proves they work.
        client.list_providers(member_of=['00000000-0000-0000-0000-000000000000'])
        return Result(Code.SUCCESS, f'Placement answers with microversions '
                                    f'up to {shown} (this release needs '
                                    f'{placement_client.MICROVERSION})')

    _upgrade_checks = (
        ('Database schema', _check_schema),
        ('Service heartbeats', _check_heartbeats),
        ('Ring settings of each partition', _check_partitions),
        ('Ironic API', _check_ironic),
        ('Placement API', _check_placement),
    )


class _Checks(Checks):
    """Checks run after the configuration is parsed and checked as the
    other commands check it (driverless database URLs get the installed
    drivers); a configuration they refuse is one line, exit 255."""

    def check(self):
        # SystemExit passes through oslo.upgradecheck's run(), which would
        # print any Exception with its traceback.
        with common.one_line_errors(PROG, COMMAND_FAILED):
            common.require_config(PROG)
            common.check_config(CONF)
        return super().check()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    common.set_log_defaults(stderr=True)
    CONF.set_default('max_retries', 0, group='database')
    CONF.set_default('api_max_retries', 0, group='ironic')
    # A file that does not parse fails in upgradecheck.main itself.
    with common.one_line_errors(PROG, COMMAND_FAILED):
        return upgradecheck.main(CONF, project=common.PROJECT,
                                 upgrade_command=_Checks(), argv=argv)


if __name__ == '__main__':
    sys.exit(main())
