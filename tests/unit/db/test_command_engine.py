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

"""db/command_engine: a command's engine opens the same session as the
daemon's (oslo.db's facade), on every backend.

The same settings are read on a connection of each engine, the same errors
come out translated, and the same transactions (a savepoint, the lock of
the scheduler) run on both.
"""

import pytest
import sqlalchemy as sa
from oslo_config import cfg
from oslo_db import exception as db_exc

from ironic_compute import conf as ic_conf
from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import command_engine
from ironic_compute.db import locks as db_locks
from ironic_compute.db import models

# What a connection of each backend says of its session.
SETTINGS = {
    'sqlite': ('PRAGMA foreign_keys', 'PRAGMA synchronous'),
    'mysql': ('SELECT @@SESSION.sql_mode', 'SELECT @@SESSION.character_set_client',
              'SELECT @@SESSION.idle_transaction_timeout'),
    'postgresql': ('SHOW client_encoding',
                   'SHOW idle_in_transaction_session_timeout'),
}


def _conf(url, **database):
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf, clients=False)
    conf([], project='ironic-compute')
    conf.set_override('connection', url, group='database')
    for name, value in database.items():
        conf.set_override(name, value, group='database')
    return conf


def _command_engine(engine, **database):
    return command_engine.create(
        db_api.ON_ENGINE_CREATE,
        _conf(engine.url.render_as_string(hide_password=False), **database))


def _settings(engine):
    with engine.connect() as connection:
        return [tuple(connection.exec_driver_sql(query).one())
                for query in SETTINGS[engine.dialect.name]]


def test_a_command_opens_the_session_the_daemon_opens(migrated_engine):
    daemon = db_api.get_engine()  # the facade's, as the daemon's
    command = _command_engine(migrated_engine)
    try:
        assert command.hide_parameters and daemon.hide_parameters
        assert _settings(command) == _settings(daemon)
    finally:
        command.dispose()


def test_its_errors_are_oslo_dbs_and_keep_their_parameters_secret(
        migrated_engine):
    command = _command_engine(migrated_engine)
    # The duplicate key is in the server's message; the other values of
    # the statement are not.
    insert = models.locks.insert().values(name='a-lock', generation=424242)
    try:
        with command.begin() as connection:
            connection.execute(insert)
        with pytest.raises(db_exc.DBDuplicateEntry) as raised:
            with command.begin() as connection:
                connection.execute(insert)
        assert '424242' not in str(raised.value)
    finally:
        command.dispose()


@pytest.fixture
def command(migrated_engine, monkeypatch):
    """A command engine on the test's database, the one the transactions
    of db_api run on meanwhile (as in ironic-compute-manage)."""
    engine = _command_engine(migrated_engine)
    monkeypatch.setattr(db_api, '_command_engine', engine)
    monkeypatch.setattr(db_api, '_command_engine_requested', True)
    monkeypatch.setattr(db_api, '_facade', None)
    assert db_api.get_engine() is engine
    yield engine
    engine.dispose()


def test_transactions_on_it_take_the_lock_and_roll_back_a_savepoint(command):
    ctx = db_api.Context()
    with db_api.context_manager.writer.using(ctx) as session:
        with db_locks.held(ctx, db_locks.SCHEDULER):
            with pytest.raises(db_exc.DBDuplicateEntry):
                with session.begin_nested():
                    session.execute(models.locks.insert().values(
                        name=db_locks.SCHEDULER))
            session.execute(models.locks.insert().values(name='kept'))
    with db_api.context_manager.reader.using(ctx) as session:
        rows = dict(session.execute(sa.select(models.locks.c.name,
                                              models.locks.c.generation)).all())
    assert rows[db_locks.SCHEDULER] >= 1
    assert rows['kept'] == 0


def test_an_error_rolls_the_whole_writer_back(command):
    # On SQLite only the BEGIN this engine emits makes the statements one
    # transaction: the driver's own handling is off.
    ctx = db_api.Context()
    with pytest.raises(RuntimeError):
        with db_api.context_manager.writer.using(ctx) as session:
            session.execute(models.locks.insert().values(name='gone'))
            raise RuntimeError('the block failed')
    with db_api.context_manager.reader.using(ctx) as session:
        names = session.execute(sa.select(models.locks.c.name)).scalars().all()
    assert 'gone' not in names


def test_a_server_that_cannot_be_reached_is_retried_as_told(monkeypatch):
    sleeps = []
    monkeypatch.setattr(command_engine.time, 'sleep', sleeps.append)
    # oslo.db translates a refused connection to MariaDB (PostgreSQL's
    # stays an OperationalError, with either engine).
    url = 'mysql+pymysql://nobody@127.0.0.1:9/none'
    with pytest.raises(db_exc.DBConnectionError):
        command_engine.create(conf=_conf(url, max_retries=3, retry_interval=7))
    assert sleeps == [7, 7]


def test_no_connection_url_is_refused():
    conf = _conf('sqlite://')
    conf.set_override('connection', '', group='database')
    with pytest.raises(db_exc.CantStartEngineError):
        command_engine.create(conf=conf)


def test_a_writer_inside_a_reader_is_refused(migrated_engine):
    ctx = db_api.Context()
    with db_api.context_manager.reader.using(ctx):
        with pytest.raises(TypeError):
            with db_api.context_manager.writer.using(ctx):
                pass
    with pytest.raises(exception.TransactionNotOpen):
        ctx.session  # noqa: B018 - the transaction ended
