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

"""Operator tools on a running daemon: the Guru Meditation Report on
SIGUSR2, and ironic-compute-status upgrade check against it."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests import db_fixtures
from tests.functional import daemons

BIN_DIR = os.path.dirname(sys.executable)


@pytest.fixture
def daemon(ironic_server, tmp_path):
    database = db_fixtures.ProvisionedDatabase('postgresql')
    options = {
        'DEFAULT': {'host': 'report-1', 'update_resources_interval': 2,
                    'report_interval': 1, 'service_down_time': 6,
                    'state_path': str(tmp_path)},
        'database': {'connection': database.url},
        'ironic': {'auth_type': 'none', 'endpoint_override': ironic_server.url,
                   'api_max_retries': 0},
    }
    fleet = daemons.Fleet(tmp_path, database.url)
    service = fleet.add('report-1', options)
    try:
        fleet.start()  # db sync, then the service
        daemons.wait_until(lambda: 'Cycle:' in service.log(), 60,
                           message='a first cycle')
        yield service
    finally:
        fleet.close()
        database.drop()


def test_sigusr2_prints_a_guru_meditation_report(daemon):
    daemon.signal(signal.SIGUSR2)
    report = daemons.wait_until(
        lambda: (daemon.log().partition('Guru Meditation')[2]
                 if 'ironic-compute  ' in daemon.log() else None), 30,
        message='the report')
    # Every loop of the daemon, by the function it runs.
    for loop in ('heartbeat_loop', 'tracker_loop', '_poll_loop'):
        assert f' in {loop}' in report
    # The configuration, with the database URL (a secret) masked.
    assert 'connection = ***' in report
    assert 'openstack_citest@' not in report
    # The service's own section, with its last cycle.
    assert 'host = report-1' in report
    assert 'last cycle = peers=1' in report
    daemon.check()  # and it goes on running
    assert daemon.alive


def test_upgrade_check_of_a_running_service(daemon):
    done = subprocess.run(
        [os.path.join(BIN_DIR, 'ironic-compute-status'), '--config-file',
         daemon.config_path, 'upgrade', 'check', '--json'],
        capture_output=True, text=True, timeout=60)
    results = {c['check']: (c['result'], c['details'])
               for c in json.loads(done.stdout)['checks']}
    assert done.returncode == 0, results
    assert results['Service heartbeats'] == (
        0, 'all 1 running services heartbeat')
    assert results['Ironic API'][1].startswith('Ironic answers with API 1.')
