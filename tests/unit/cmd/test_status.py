"""ironic-compute-status upgrade check on each backend, in this process.

The checks run as the command runs them, against the database the fixtures
point the facade at. tests/functional/test_cli_processes.py runs the same
scenarios (the functions below without ``test_``) with the command itself:
its JSON output and exit code.
"""

import datetime

from ironic_compute import agreement
from ironic_compute.cmd import status
from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from ironic_compute.db import models
from ironic_compute.db import services as db_services

_services = models.Service.__table__


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
    assert level == 1 and details.startswith('3 of 4 services heartbeat; '
                                             'down: cmp-3: no heartbeat for')


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


def test_a_schema_behind_this_release(engine):
    a_schema_behind_this_release(engine, checks)


def test_an_empty_database(engine):
    an_empty_database(checks)
