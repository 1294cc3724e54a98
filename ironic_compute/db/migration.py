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

"""Schema migrations with alembic, and whether this code runs on a schema.

Rolling upgrades: ``db sync`` of a newer release moves the database to
revisions an older service has never seen, while older services still run.
Each migration module declares ``expand_only = True`` when it only adds
what older code ignores (a nullable column, an index, a wider type), and
``False`` when it removes or changes what older code uses (a contract
migration). An older code tree does not have the newer migration files, so
``upgrade`` records the flag of every revision it knows in a table of its
own, ``schema_compatibility``, outside alembic: an older service walks from
the database's revision down to its own head through that table, and runs
only when every step is expand-only. Later releases must keep that table's
columns as they are.
"""

import dataclasses
import os

import sqlalchemy as sa
from alembic import command as alembic_command
from alembic import config as alembic_config
from alembic import migration as alembic_migration
from alembic import script as alembic_script

from ironic_compute import exception
from ironic_compute.db import api as db_api

_SCRIPT_LOCATION = os.path.join(os.path.dirname(__file__), 'migrations')
SYNC_HINT = 'run "ironic-compute-manage db sync"'

COMPATIBILITY = sa.Table(
    'schema_compatibility', sa.MetaData(),
    sa.Column('revision', sa.String(32), primary_key=True),
    sa.Column('down_revision', sa.String(32)),
    sa.Column('expand_only', sa.Boolean, nullable=False))


def _config(connection, script_location=None):
    config = alembic_config.Config()
    config.set_main_option('script_location',
                           script_location or _SCRIPT_LOCATION)
    config.attributes['connection'] = connection
    return config


def _script(script_location=None):
    return alembic_script.ScriptDirectory(script_location or _SCRIPT_LOCATION)


def expand_only(script):
    """The ``expand_only`` flag of one alembic Script; False when missing.

    A migration that does not say is taken as a contract one: refusing to
    start is safer than running old code on a schema it does not know.
    """
    return getattr(script.module, 'expand_only', False) is True


def _record(connection, script_location=None):
    """Record every known revision's flag; keep rows newer code wrote."""
    COMPATIBILITY.create(connection, checkfirst=True)
    recorded = {row.revision: row for row in
                connection.execute(sa.select(COMPATIBILITY))}
    for script in _script(script_location).walk_revisions():
        values = {'revision': script.revision,
                  'down_revision': script.down_revision,
                  'expand_only': expand_only(script)}
        row = recorded.get(script.revision)
        if row is None:
            connection.execute(COMPATIBILITY.insert().values(**values))
        elif (row.down_revision, row.expand_only) != (
                values['down_revision'], values['expand_only']):
            connection.execute(COMPATIBILITY.update().where(
                COMPATIBILITY.c.revision == script.revision).values(**values))


def upgrade(revision='head', engine=None, script_location=None):
    """Apply the migrations up to ``revision``; record their flags."""
    engine = engine or db_api.get_engine()
    with engine.begin() as connection:
        alembic_command.upgrade(_config(connection, script_location),
                                revision)
        _record(connection, script_location)


def version(engine=None):
    """The revision the database is at, or None for an empty database."""
    engine = engine or db_api.get_engine()
    with engine.connect() as connection:
        return alembic_migration.MigrationContext.configure(
            connection).get_current_revision()


def revisions():
    """Every revision this code knows."""
    return {rev.revision for rev in _script().walk_revisions()}


def head(script_location=None):
    """The newest revision this code knows."""
    return _script(script_location).get_current_head()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether code whose newest revision is ``head`` runs on ``current``.

    ``state`` is one of: empty, older, current, newer (expand-only steps
    in between: runs), incompatible, unknown.
    """

    state: str
    current: str | None
    head: str
    blocker: str | None = None

    @property
    def runs(self):
        return self.state in ('current', 'newer')

    def message(self):
        at = f'database schema is at version {self.current}'
        return {
            'empty': f'the database has no schema: {SYNC_HINT}',
            'older': f'{at}, this service needs {self.head}: {SYNC_HINT}',
            'current': f'{at}',
            'newer': (f'{at}, newer than this release ({self.head}); the '
                      'migrations in between are expand-only, so this '
                      'release runs on it: upgrade it soon'),
            'incompatible': (
                f'{at}, newer than this release ({self.head}), and migration '
                f'{self.blocker} is not expand-only: this release cannot run '
                'on it; upgrade to the release that ran "db sync"'),
            'unknown': (
                f'{at}, which this release ({self.head}) does not know and '
                'the database does not describe (no schema_compatibility '
                'row leads from it to this release): upgrade to the release '
                'that ran "db sync"'),
        }[self.state]


def judge(current, head, known, recorded):
    """The Verdict for code at ``head`` knowing ``known`` revisions.

    ``recorded`` maps a revision to (down_revision, expand_only) as read
    from the schema_compatibility table. Pure: no I/O.
    """
    if current is None:
        return Verdict('empty', current, head)
    if current == head:
        return Verdict('current', current, head)
    if current in known:
        return Verdict('older', current, head)
    steps, revision = [], current
    while revision != head:
        if revision not in recorded or revision in steps:
            return Verdict('unknown', current, head)
        steps.append(revision)
        revision = recorded[revision][0]
    contract = [step for step in steps if not recorded[step][1]]
    if contract:
        # The oldest one: the first migration this release cannot survive.
        return Verdict('incompatible', current, head, blocker=contract[-1])
    return Verdict('newer', current, head)


def _recorded(connection):
    if not sa.inspect(connection).has_table(COMPATIBILITY.name):
        return {}
    return {row.revision: (row.down_revision, row.expand_only)
            for row in connection.execute(sa.select(COMPATIBILITY))}


def verdict(engine=None, script_location=None, head_revision=None):
    """Judge the database for this code (or a simulated older head)."""
    script = _script(script_location)
    head_revision = head_revision or script.get_current_head()
    known = {rev.revision
             for rev in script.iterate_revisions(head_revision, 'base')}
    engine = engine or db_api.get_engine()
    with engine.connect() as connection:
        current = alembic_migration.MigrationContext.configure(
            connection).get_current_revision()
        recorded = _recorded(connection) if current not in known else {}
    return judge(current, head_revision, known, recorded)


def sync(engine=None, script_location=None):
    """``db sync``: upgrade to this code's head; return the Verdict after.

    A schema that a newer release has moved on is left alone: when its
    newer migrations are expand-only this release's ``db sync`` has nothing
    to do (a configuration tool may run it on every host of a rolling
    upgrade); otherwise SchemaError says which release it needs.
    """
    before = verdict(engine, script_location)
    if before.state == 'newer':
        return before
    if before.state in ('incompatible', 'unknown'):
        raise exception.SchemaError(before.message())
    upgrade('head', engine, script_location)
    return verdict(engine, script_location)


def check_schema(engine=None, script_location=None, head_revision=None):
    """Raise SchemaError unless this code runs on the database's schema.

    Returns the Verdict: ``newer`` is worth a warning in the log.
    """
    result = verdict(engine, script_location, head_revision)
    if not result.runs:
        raise exception.SchemaError(result.message())
    return result
