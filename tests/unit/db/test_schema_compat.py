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

"""Rolling upgrades: which schema a release runs on, with real migrations.

An older release is simulated by a copy of the migrations without the
newest revisions; a newer one by a copy with extra revisions, one
expand-only and one contract. Each runs against a fresh database on every
backend.
"""

import pytest
import sqlalchemy as sa

from ironic_compute import exception
from ironic_compute.db import migration
from tests.unit.db.releases import OLD_HEAD
from tests.unit.db.releases import newer_release
from tests.unit.db.releases import older_release


def test_every_migration_says_whether_it_is_expand_only():
    for script in migration._script().walk_revisions():
        assert isinstance(getattr(script.module, 'expand_only', None), bool), (
            script.path)


@pytest.mark.parametrize('current, recorded, state, blocker', [
    (None, {}, 'empty', None),
    ('3', {}, 'current', None),
    ('2', {}, 'older', None),
    ('5', {'5': ('4', True), '4': ('3', True)}, 'newer', None),
    ('5', {'5': ('4', True), '4': ('3', False)}, 'incompatible', '4'),
    ('6', {'6': ('5', False), '5': ('4', True), '4': ('3', False)},
     'incompatible', '4'),
    ('5', {}, 'unknown', None),
    ('5', {'5': ('4', True)}, 'unknown', None),      # the chain breaks off
    ('5', {'5': ('x', True), 'x': (None, True)}, 'unknown', None),
    ('5', {'5': ('4', True), '4': ('5', True)}, 'unknown', None),  # a loop
])
def test_judge(current, recorded, state, blocker):
    result = migration.judge(current, '3', {'1', '2', '3'}, recorded)
    assert (result.state, result.blocker) == (state, blocker)
    assert result.runs == (state in ('current', 'newer'))


def test_sync_records_every_revision(engine):
    migration.upgrade('head', engine=engine)
    with engine.connect() as conn:
        rows = {r.revision: (r.down_revision, bool(r.expand_only)) for r in
                conn.execute(sa.select(migration.COMPATIBILITY))}
    expected = {s.revision: (s.down_revision, migration.expand_only(s))
                for s in migration._script().walk_revisions()}
    assert rows == expected
    assert rows['0001'] == (None, False)
    assert rows['0002'] == ('0001', True)


def test_older_release_runs_on_this_releases_schema(engine, tmp_path):
    old = older_release(tmp_path)
    assert migration.head(old) == OLD_HEAD
    migration.sync(engine)  # this release's db sync
    result = migration.check_schema(engine, script_location=old)
    assert result.state == 'newer'
    assert 'expand-only' in result.message()
    # The older release's own db sync leaves the newer schema alone.
    assert migration.sync(engine, script_location=old).state == 'newer'
    assert migration.version(engine) == migration.head()


def test_this_release_refuses_an_older_schema(engine, tmp_path):
    migration.sync(engine, script_location=older_release(tmp_path))
    assert migration.version(engine) == OLD_HEAD
    with pytest.raises(exception.SchemaError,
                       match=rf'at version {OLD_HEAD}, this service needs '
                             rf'{migration.head()}: run "ironic-compute-manage'
                             ' db sync"'):
        migration.check_schema(engine)
    assert migration.sync(engine).state == 'current'
    assert migration.check_schema(engine).state == 'current'


def test_an_empty_database_is_refused(engine):
    with pytest.raises(exception.SchemaError, match='has no schema: run'):
        migration.check_schema(engine)


def test_contract_migration_stops_this_release(engine, tmp_path):
    new = newer_release(tmp_path)
    migration.upgrade('0901', engine=engine, script_location=new)
    assert migration.check_schema(engine).state == 'newer'
    migration.sync(engine, script_location=new)
    assert migration.version(engine) == '0902'
    message = (rf'at version 0902, newer than this release \({migration.head()}'
               r'\), and migration 0902 is not expand-only')
    with pytest.raises(exception.SchemaError, match=message):
        migration.check_schema(engine)
    with pytest.raises(exception.SchemaError, match=message):
        migration.sync(engine)
    assert migration.version(engine) == '0902'
    # The older release is stopped by the same contract migration.
    with pytest.raises(exception.SchemaError, match='migration 0902'):
        migration.check_schema(engine, script_location=older_release(tmp_path))


def test_a_revision_nobody_recorded_is_refused(engine):
    migration.sync(engine)
    # A database upgraded by a tree that did not record its revisions.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00d'"))
    with pytest.raises(exception.SchemaError,
                       match='at version f00d, which this release'):
        migration.check_schema(engine)
    with engine.begin() as conn:
        conn.execute(migration.COMPATIBILITY.delete())
        conn.execute(sa.text(
            f"UPDATE alembic_version SET version_num = '{migration.head()}'"))
    # An older release finds no row to walk: unknown, not "compatible".
    with pytest.raises(exception.SchemaError, match='does not know'):
        migration.check_schema(engine, head_revision='0003')


def test_the_service_warns_on_a_newer_compatible_schema(engine, tmp_path,
                                                        caplog):
    from ironic_compute.daemon import service
    migration.upgrade('0901', engine=engine,
                      script_location=newer_release(tmp_path))
    with caplog.at_level('WARNING'):
        service.check_schema()
    assert 'at version 0901, newer than this release' in caplog.text
    migration.upgrade('0902', engine=engine,
                      script_location=newer_release(tmp_path / 'again'))
    with pytest.raises(exception.SchemaError, match='0902 is not expand-only'):
        service.check_schema()
