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

"""ironic-compute-status upgrade check on each backend, in this process.

The checks run as the command runs them, against the database the fixtures
point the facade at. tests/functional/test_cli_processes.py runs the same
scenarios (the functions below without ``test_``) with the command itself:
its JSON output and exit code.
"""

import datetime
import types

import pytest

from ironic_compute import conf as ic_conf
from ironic_compute.cmd import status
from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.ring import agreement

_services = models.services
# The command registers the options when it starts; these tests call the
# checks without it.
ic_conf.register_opts(status.CONF)


def checks():
    """(exit code, {check name: (code, details)}) of every check."""
    command = status.Checks()
    results = {name: check(command) for name, check in command._upgrade_checks}
    code = max(result.code for result in results.values())
    return code, {name: (result.code, result.details)
                  for name, result in results.items()}


def service(host, partition=None, exponent=16, peer_list=()):
    service_id = db_services.register(db_api.Context(), host,
                                      partition_key=partition)
    db_services.record_cycle(db_api.Context(), service_id, 0.1, partition,
                             None, agreement.ring_settings(exponent, 1.1,
                                                           peer_list, partition))


def url_of(engine):
    return engine.url.render_as_string(hide_password=False)


# A scenario fills the database, calls ``checks()`` for (exit code,
# {check name: (code, details)}) and asserts on the answer.

def agreeing_services_at_head(checks):
    service('cmp-1', 'rack-1', peer_list=('cmp-1', 'cmp-2'))
    service('cmp-2', 'rack-1', peer_list=('CMP-2', 'cmp-1'))
    service('cmp-3', 'rack-2', exponent=12)  # another partition may differ
    code, results = checks()
    assert results['Database schema'] == (
        0, f'database schema is at version {migration.head()}')
    assert results['Service heartbeats'] == (
        0, 'all 3 running services heartbeat')
    assert results['Ring settings of each partition'][0] == 0
    # [ironic] is not configured in this test: a warning, exit code 1.
    assert results['Ironic API'] == (
        1, '[ironic] is not configured here: not checked')
    assert results['Placement API'] == (
        0, '[placement] is not configured: no provider is reported '
           '(optional)')
    assert code == 1


def disagreeing_services_and_a_dead_one(engine, checks):
    service('cmp-1', 'rack-1', peer_list=('cmp-1', 'cmp-2'))
    service('cmp-2', 'rack-1', exponent=12, peer_list=('cmp-1', 'cmp-2'))
    service('cmp-4', 'rack-1', peer_list=('cmp-4',))
    service('cmp-3')
    with engine.begin() as conn:
        conn.execute(_services.update().where(_services.c.host == 'cmp-3')
                     .values(last_seen_up=datetime.datetime(2020, 1, 1)))
    code, results = checks()
    assert code == 2
    level, details = results['Ring settings of each partition']
    assert level == 2
    assert details.startswith('partition rack-1: cmp-2 differs from cmp-1 in '
                              'partition_exponent 12 (here 16)')
    assert "cmp-4 differs from cmp-1 in peer_list ['cmp-4']" in details
    level, details = results['Service heartbeats']
    assert level == 1 and details.startswith(
        '3 of 4 running services heartbeat; down: cmp-3: no heartbeat for')


def stopped_and_disabled_services_apart(engine, checks):
    for host in ('cmp-1', 'cmp-2', 'cmp-5', 'cmp-6', 'cmp-7'):
        service(host)
    with engine.begin() as conn:
        conn.execute(_services.update().where(_services.c.host == 'cmp-5')
                     .values(stopped_at=datetime.datetime(2026, 1, 1)))
        # Disabled, and silent for long: still not a failure to report.
        conn.execute(_services.update().where(
            _services.c.host.in_(['cmp-6', 'cmp-7'])).values(
            disabled=True, last_seen_up=datetime.datetime(2020, 1, 1)))
    code, results = checks()
    assert results['Service heartbeats'] == (
        0, 'all 2 running services heartbeat; disabled: cmp-6, cmp-7; '
           'stopped: cmp-5')
    with engine.begin() as conn:
        conn.execute(_services.update().where(_services.c.host.in_(
            ['cmp-1', 'cmp-2'])).values(
            stopped_at=datetime.datetime(2026, 1, 1)))
    code, results = checks()
    assert results['Service heartbeats'] == (
        1, 'no ironic-compute service is running; disabled: cmp-6, cmp-7; '
           'stopped: cmp-1, cmp-2, cmp-5')


def a_schema_behind_this_release(engine, checks):
    migration.upgrade('0005', engine=engine)
    code, results = checks()
    assert code == 2
    assert results['Database schema'] == (
        2, 'database schema is at version 0005, this service needs '
           f'{migration.head()}: run "ironic-compute-manage db sync"')


def an_empty_database(checks):
    code, results = checks()
    assert code == 2
    assert results['Database schema'][1].startswith('the database has no '
                                                    'schema')


def test_at_head_with_agreeing_services(migrated_engine):
    agreeing_services_at_head(checks)


def test_disagreeing_services_and_a_dead_one(migrated_engine):
    disagreeing_services_and_a_dead_one(migrated_engine, checks)


def test_stopped_and_disabled_services_are_reported_apart(migrated_engine):
    stopped_and_disabled_services_apart(migrated_engine, checks)


class FakeIronicClient:
    """The adapter as the check uses it: the API version Ironic answers."""

    version = '1.115'

    def __init__(self, conf):
        pass

    def api(self):
        return types.SimpleNamespace(current_api_version=self.version)


@pytest.fixture
def ironic_at(monkeypatch):
    """ironic_at('1.50', shard_ring=True): [ironic] configured, Ironic
    answering with that version; returns the check's (code, details)."""
    conf = status.CONF

    def check(version, **options):
        monkeypatch.setattr(FakeIronicClient, 'version', version)
        monkeypatch.setattr(status.ironic, 'IronicClient', FakeIronicClient)
        conf.set_override('auth_type', 'none', group='ironic')
        for name, value in options.items():
            conf.set_override(name, value, group='ironic')
        try:
            result = status.Checks()._check_ironic()
        finally:
            for name in ('auth_type', *options):
                conf.clear_override(name, group='ironic')
        return result.code, result.details

    return check


def test_an_ironic_too_old_for_this_release_fails(ironic_at):
    assert ironic_at('1.51') == (
        2, 'Ironic answers with API 1.51: instances (allocations) needs 1.52')
    assert ironic_at('1.52') == (0, 'Ironic answers with API 1.52')
    assert ironic_at('1.45', partition_key='rack-1') == (
        2, 'Ironic answers with API 1.45: instances (allocations) needs '
           '1.52; [ironic]partition_key needs 1.46')


def test_the_shard_ring_needs_the_shards_api(ironic_at):
    assert ironic_at('1.81', shard_ring=True) == (
        2, 'Ironic answers with API 1.81: [ironic]shard_ring needs 1.82')
    assert ironic_at('1.82', shard_ring=True) == (
        0, 'Ironic answers with API 1.82')
    assert ironic_at('1.81', shard='ic-01') == (
        2, 'Ironic answers with API 1.81: [ironic]shard needs 1.82')
    assert ironic_at('1.81') == (0, 'Ironic answers with API 1.81')


@pytest.mark.parametrize('served, expected', [
    ('1.39', (0, 'Placement answers with microversions up to 1.39 (this '
                 'release needs 1.38)')),
    ('1.37', (2, 'Placement serves microversions up to 1.37; this release '
                 'needs 1.38')),
])
def test_placement_answers_with_the_microversions_used(monkeypatch, served,
                                                       expected):
    from ironic_compute.harness.fake_placement import FakePlacement
    from ironic_compute.harness.fake_placement import Response

    fake = FakePlacement()
    fake.before = lambda method, path: Response(200, {'versions': [
        {'max_version': served}]}) if path == '/' else None
    real = status.placement_client.PlacementClient
    monkeypatch.setattr(status.placement_client, 'PlacementClient',
                        lambda conf: real(conf, adapter=fake))
    monkeypatch.setattr(status.placement_client, 'configured',
                        lambda conf: True)
    result = status.Checks()._check_placement()
    assert (result.code, result.details) == expected


def test_placement_that_refuses_the_credentials_fails(monkeypatch):
    from ironic_compute.harness.fake_placement import FakePlacement
    from ironic_compute.harness.fake_placement import Response

    fake = FakePlacement()
    fake.before = lambda method, path: None if path == '/' else Response(
        403, {'errors': [{'detail': 'Forbidden'}]})
    real = status.placement_client.PlacementClient
    monkeypatch.setattr(status.placement_client, 'PlacementClient',
                        lambda conf: real(conf, adapter=fake))
    monkeypatch.setattr(status.placement_client, 'configured',
                        lambda conf: True)
    result = status.Checks()._check_placement()
    assert result.code == 2 and 'HTTP 403: Forbidden' in result.details


def test_a_schema_behind_this_release(engine):
    a_schema_behind_this_release(engine, checks)


def test_an_empty_database(engine):
    an_empty_database(checks)
