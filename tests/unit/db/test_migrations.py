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

"""Migrations on every backend: up from empty, in sync with the models."""

import json

import pytest
import sqlalchemy as sa
from alembic import autogenerate
from alembic import migration as alembic_migration

from ironic_compute import exception
from ironic_compute.db import migration
from ironic_compute.db import models
from tests import db_fixtures


def test_empty_database_has_no_version(engine):
    assert migration.version(engine) is None


def test_upgrade_from_empty_reaches_head(engine):
    migration.upgrade('head', engine=engine)
    assert migration.version(engine) == migration.head()
    tables = set(sa.inspect(engine).get_table_names())
    assert {'services', 'compute_nodes', 'instances'} <= tables


def test_upgrade_twice_is_a_no_op(engine):
    migration.upgrade('head', engine=engine)
    migration.upgrade('head', engine=engine)
    assert migration.version(engine) == migration.head()


def test_models_match_migrations(engine):
    migration.upgrade('head', engine=engine)
    with engine.connect() as conn:
        context = alembic_migration.MigrationContext.configure(
            conn, opts={'compare_type': True,
                        'compare_server_default': False})
        diff = autogenerate.compare_metadata(context, models.metadata)
    # db sync keeps schema_compatibility outside the models on purpose.
    diff = [d for d in diff if not (d[0] == 'remove_table'
                                    and d[1].name == 'schema_compatibility')]
    assert diff == []


def test_per_cycle_queries_have_indexes(engine):
    migration.upgrade('head', engine=engine)
    inspector = sa.inspect(engine)

    def indexed(table):
        columns = [tuple(i['column_names']) for i in inspector.get_indexes(table)]
        columns += [tuple(u['column_names'])
                    for u in inspector.get_unique_constraints(table)]
        return columns

    assert ('host', 'deleted') in indexed('compute_nodes')
    assert ('uuid', 'deleted') in indexed('compute_nodes')
    assert ('binary', 'deleted') in indexed('services')
    assert ('host', 'binary', 'deleted') in indexed('services')
    assert ('host', 'deleted') in indexed('instances')
    assert ('uuid', 'deleted') in indexed('instances')
    assert ('node', 'deleted') in indexed('instances')


def test_shard_ring_columns(engine):
    # Migration 0007: a shard_ring cycle reads its shards' rows by index.
    migration.upgrade('head', engine=engine)
    inspector = sa.inspect(engine)
    indexes = [tuple(i['column_names']) for i in inspector.get_indexes('compute_nodes')]
    assert ('conductor_group', 'shard', 'deleted') in indexes
    columns = {c['name']: c for c in inspector.get_columns('services')}
    assert columns['shard_ring']['nullable'] is False
    with engine.begin() as conn:
        conn.execute(models.services.insert().values(
            host='h', binary='ironic-compute', created_at=models._utcnow()))
        assert conn.execute(sa.select(models.services.c.shard_ring)).scalar() is False


def test_0008_refuses_two_live_instances_on_one_node(engine):
    migration.upgrade('0007', engine=engine)
    node = '1be26c0b-03f2-4d2e-ae87-c02d7f33c123'
    instances = sa.table('instances', sa.column('uuid'), sa.column('host'),
                         sa.column('node'), sa.column('deleted'),
                         sa.column('created_at'))
    with engine.begin() as conn:
        for uuid in ('a' * 36, 'b' * 36):
            conn.execute(instances.insert().values(
                uuid=uuid, host='h', node=node, deleted=0,
                created_at=sa.func.current_timestamp()))
    try:
        migration.upgrade('head', engine=engine)
    except exception.SchemaError as exc:
        assert str(exc).startswith('cannot add the one-live-instance-per-node '
                                   f'constraint: nodes {node} have two')
    else:
        raise AssertionError('0008 accepted two live instances on one node')
    assert migration.version(engine) == '0007'


def _collations(conn):
    return dict(conn.execute(sa.text(
        'SELECT column_name, collation_name FROM information_schema.columns'
        " WHERE table_schema = DATABASE() AND table_name = 'compute_nodes'"
        " AND column_name IN ('resource_class', 'traits')")).all())


def _add_node(conn, uuid, resource_class, traits, host='h'):
    conn.execute(sa.text(
        'INSERT INTO compute_nodes (uuid, host, resource_class, traits,'
        ' available, created_at, deleted) VALUES (:uuid, :host, :rc,'
        ' :traits, :available, :now, 0)'),
        {'uuid': uuid, 'host': host, 'rc': resource_class, 'traits': traits,
         'available': True, 'now': models._utcnow()})


def _matching(conn, resource_class):
    return sorted(conn.execute(sa.text(
        'SELECT uuid FROM compute_nodes WHERE host = :host'
        ' AND resource_class = :rc AND available = :available'
        ' AND deleted = 0'),
        {'host': 'h', 'rc': resource_class, 'available': True}).scalars())


@pytest.mark.parametrize('database, charset', [
    *((backend, 'utf8mb4') for backend in db_fixtures.BACKENDS),
    ('mysql', 'utf8mb3'),  # a character set of MariaDB's only
], indirect=['database'])
def test_0011_resource_classes_and_traits_compare_exactly(engine, charset):
    # MariaDB's default collation ignores case; 0011 gives the columns the
    # binary collation of their character set, rows kept as they were.
    # PostgreSQL and SQLite compare exactly without it.
    migration.upgrade('0010', engine=engine)
    mysql = engine.dialect.name == 'mysql'
    with engine.begin() as conn:
        if mysql:
            conn.execute(sa.text('ALTER TABLE compute_nodes CONVERT TO '
                                 f'CHARACTER SET {charset}'))
        _add_node(conn, 'a' * 36, 'baremetal', '|CUSTOM_A|')
        _add_node(conn, 'b' * 36, 'BAREMETAL', '|custom_a|')
    migration.upgrade('head', engine=engine)
    with engine.connect() as conn:
        if mysql:
            assert _collations(conn) == {'resource_class': f'{charset}_bin',
                                         'traits': f'{charset}_bin'}
        assert _matching(conn, 'baremetal') == ['a' * 36]
        assert _matching(conn, 'BAREMETAL') == ['b' * 36]
        assert _matching(conn, 'Baremetal') == []
        assert conn.execute(sa.text(
            'SELECT uuid FROM compute_nodes WHERE traits = :traits'),
            {'traits': '|CUSTOM_A|'}).scalars().all() == ['a' * 36]


@pytest.mark.parametrize('database', ['mysql'], indirect=True)  # the collation changes there
def test_0011_the_scheduler_index_still_serves_the_resource_class(engine):
    # The equality on a column of the binary collation is still a part of
    # the index range (host, resource class, available, deleted), as the
    # scheduler's probes ask it (node_match: FORCE INDEX).
    migration.upgrade('head', engine=engine)
    with engine.begin() as conn:
        for i in range(40):
            _add_node(conn, f'{i:036d}', ('baremetal', 'gpu')[i % 2], None,
                      host=f'h{i % 4}')
    with engine.connect() as conn:
        plan = json.loads(conn.execute(sa.text(
            'EXPLAIN FORMAT=JSON SELECT id FROM compute_nodes'
            ' FORCE INDEX (compute_nodes_host_rc_available_idx)'
            ' WHERE host = :host AND resource_class = :rc'
            ' AND available = :available AND deleted = 0'),
            {'host': 'h1', 'rc': 'baremetal', 'available': True}).scalar())
    block = plan['query_block']
    # MariaDB 10.11 nests the table in a nested_loop list.
    table = block['nested_loop'][0]['table'] if 'nested_loop' in block \
        else block['table']
    assert table['key'] == 'compute_nodes_host_rc_available_idx', plan
    assert table['used_key_parts'] == ['host', 'resource_class', 'available',
                                       'deleted'], table


def test_0013_backfills_node_capabilities_and_compares_them_exactly(engine):
    # Rows synced before 0013 get the capabilities column from their stats,
    # as the tracker now writes it; on MariaDB it compares as written.
    migration.upgrade('0012', engine=engine)
    with engine.begin() as conn:
        for uuid, capabilities in (('a' * 36, {'boot_mode': 'uefi',
                                               'has_gpu': 'true'}),
                                   ('b' * 36, {'boot_mode': 'UEFI'}),
                                   ('c' * 36, None)):
            _add_node(conn, uuid, 'baremetal', '|')
            stats = json.dumps({'capabilities': capabilities}
                               if capabilities is not None else {})
            conn.execute(sa.text('UPDATE compute_nodes SET stats = :stats'
                                 ' WHERE uuid = :uuid'),
                         {'stats': stats, 'uuid': uuid})
    migration.upgrade('head', engine=engine)
    with engine.connect() as conn:
        by_uuid = dict(conn.execute(sa.text(
            'SELECT uuid, capabilities FROM compute_nodes')).all())
        assert by_uuid == {'a' * 36: '|boot_mode:uefi|has_gpu:true|',
                           'b' * 36: '|boot_mode:UEFI|', 'c' * 36: '|'}
        assert conn.execute(sa.text(
            'SELECT uuid FROM compute_nodes WHERE capabilities = :c'),
            {'c': '|boot_mode:uefi|has_gpu:true|'}).scalars().all() == [
                'a' * 36]
        columns = {c['name'] for c in sa.inspect(conn).get_columns(
            'instances')}
    assert {'capabilities', 'ephemeral_gb', 'ephemeral_format', 'swap_mb',
            'image_checksum', 'image_kernel', 'image_ramdisk', 'project_id',
            'user_id'} <= columns
