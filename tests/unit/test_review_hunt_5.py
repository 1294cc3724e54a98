"""Hunt 5: the project's own transactions (db/api.py) and the command
engine (db/command_engine.py) against oslo.db's enginefacade.

What oslo.db's facade and engine did, checked on every backend where it can
differ: a failed COMMIT (retried only when the server refused it), a
BaseException in the block, one Context in two threads, a MariaDB deadlock
inside a savepoint (a conflict on a Core Connection too), and a command
engine that reads at the daemon's isolation and counts matched rows.
"""

import threading
import time

import pytest
import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute.cmd import manage
from ironic_compute.db import api as db_api
from ironic_compute.db import models
from tests.unit.cmd.conftest import in_process  # noqa: F401 - the fixture
from tests.unit.db.test_command_engine import _command_engine


@pytest.fixture
def held(migrated_engine):
    """The connections of the engine checked out of its pool now."""
    out = []
    sa.event.listen(migrated_engine, 'checkout', lambda *a: out.append(1))
    sa.event.listen(migrated_engine, 'checkin', lambda *a: out.pop())
    return out


def _names(ctx):
    with db_api.context_manager.reader.using(ctx) as session:
        return session.execute(sa.select(models.locks.c.name)).scalars().all()


def test_a_deadlock_at_commit_is_retried_once_and_leaves_nothing_open(
        held, monkeypatch):
    calls = []
    real_commit = sa.engine.RootTransaction.commit

    # The server refuses the first COMMIT (a Galera certification failure).
    refusals = [db_exc.DBDeadlock('deadlock at COMMIT')]

    def commit(self):
        if refusals:
            raise refusals.pop()
        return real_commit(self)

    @db_api.writer
    def insert(ctx):
        calls.append(1)
        ctx.session.execute(models.locks.insert().values(name='once'))

    monkeypatch.setattr(sa.engine.RootTransaction, 'commit', commit)
    ctx = db_api.Context()
    insert(ctx)
    monkeypatch.undo()
    assert len(calls) == 2
    assert not db_api._in_transaction(ctx)
    assert _names(ctx).count('once') == 1
    assert held == []


@pytest.mark.parametrize('error', [KeyboardInterrupt, GeneratorExit, SystemExit])
def test_a_base_exception_rolls_back_and_returns_the_connection(held, error):
    ctx = db_api.Context()
    with pytest.raises(error):
        with db_api.context_manager.writer.using(ctx) as session:
            session.execute(models.locks.insert().values(name='never'))
            raise error()
    assert not db_api._in_transaction(ctx)
    assert 'never' not in _names(ctx)
    assert held == []


def test_a_connection_lost_at_commit_is_not_retried(held, monkeypatch):
    calls = []

    def commit(self):
        raise db_exc.DBConnectionError('lost at COMMIT')

    @db_api.writer
    def insert(ctx):
        calls.append(1)
        ctx.session.execute(models.locks.insert().values(name='maybe'))

    monkeypatch.setattr(sa.engine.RootTransaction, 'commit', commit)
    ctx = db_api.Context()
    with pytest.raises(db_exc.DBConnectionError):
        insert(ctx)
    monkeypatch.undo()
    assert calls == [1]
    assert not db_api._in_transaction(ctx)
    assert held == []


def test_one_context_in_two_threads_opens_two_transactions(migrated_engine):
    ctx = db_api.Context()
    seen = []
    with db_api.context_manager.writer.using(ctx) as mine:
        def other():
            seen.append(db_api._in_transaction(ctx))
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert ctx.session is mine
    assert seen == [False]


def _deadlock_in_savepoint(engine):
    """Make this thread's writer the victim of a deadlock while it is inside
    a savepoint; return what the writer raised."""
    locks = models.locks
    with engine.begin() as conn:
        conn.execute(locks.insert(), [{'name': n} for n in
                                      ['r1', 'r2'] + [f'b{i}' for i in range(50)]])
    ctx = db_api.Context()
    a_waits = threading.Event()
    b_holds = threading.Event()
    other_error = []

    def other():
        try:
            _other()
        except Exception as exc:  # noqa: BLE001 - reported if no deadlock
            other_error.append(exc)

    def _other():
        # More writes than the victim's: InnoDB rolls back the smaller one.
        with engine.connect() as conn, conn.begin():
            for i in range(50):
                conn.execute(locks.update().where(locks.c.name == f'b{i}')
                             .values(generation=1))
            conn.execute(locks.update().where(locks.c.name == 'r2')
                         .values(generation=5))
            b_holds.set()
            a_waits.wait(10)
            # The writer's UPDATE of r2 is waiting by then.
            time.sleep(0.5)
            conn.execute(locks.update().where(locks.c.name == 'r1')
                         .values(generation=5))

    thread = threading.Thread(target=other)
    thread.start()
    try:
        with db_api.context_manager.writer.using(ctx) as session:
            session.execute(locks.update().where(locks.c.name == 'r1')
                            .values(generation=1))
            b_holds.wait(10)
            with session.begin_nested():
                a_waits.set()
                session.execute(locks.update().where(locks.c.name == 'r2')
                                .values(generation=1))
    except Exception as exc:  # noqa: BLE001 - what it raised is the result
        return exc
    finally:
        thread.join()
    raise AssertionError(f'no deadlock for this writer: {other_error!r}')


@pytest.mark.parametrize('migrated_engine', ['mysql'], indirect=True)
def test_a_deadlock_inside_a_savepoint_is_a_conflict_on_mariadb(migrated_engine):
    raised = _deadlock_in_savepoint(migrated_engine)
    assert raised is not None
    assert db_api._is_conflict(raised), repr(raised)


ISOLATION = {
    'sqlite': 'PRAGMA read_uncommitted',
    'mysql': 'SELECT @@SESSION.tx_isolation, @@SESSION.autocommit',
    'postgresql': 'SHOW transaction_isolation',
}


def _inside_a_reader(engine, monkeypatch):
    """The isolation of a reader on ``engine``, and whether the driver's
    connection is inside a transaction after a read (one snapshot)."""
    monkeypatch.setattr(db_api, 'get_engine', lambda: engine)
    ctx = db_api.Context()
    with db_api.context_manager.reader.using(ctx) as session:
        isolation = tuple(session.exec_driver_sql(
            ISOLATION[engine.dialect.name]).one())
        session.execute(sa.select(models.locks.c.name)).all()
        dbapi = session.connection.dbapi_connection
        in_transaction = (dbapi.in_transaction if engine.dialect.name == 'sqlite'
                          else None)
    return isolation, in_transaction


def test_the_command_engine_reads_as_the_daemons_does(migrated_engine, monkeypatch):
    command = _command_engine(migrated_engine)
    try:
        daemon = _inside_a_reader(migrated_engine, monkeypatch)
        assert _inside_a_reader(command, monkeypatch) == daemon
    finally:
        command.dispose()
    if migrated_engine.dialect.name == 'sqlite':
        assert daemon[1] is True


def _rowcount_of_an_update_that_changes_nothing(engine):
    with engine.begin() as conn:
        conn.execute(models.locks.insert().values(name='same', generation=3))
    try:
        with engine.begin() as conn:
            return conn.execute(models.locks.update()
                                .where(models.locks.c.name == 'same')
                                .values(generation=3)).rowcount
    finally:
        with engine.begin() as conn:
            conn.execute(models.locks.delete()
                         .where(models.locks.c.name == 'same'))


def test_a_conditional_write_counts_the_matched_row_on_the_command_engine(
        migrated_engine):
    # The conditional writes (rowcount == 1) need the rows matched, not the
    # rows changed (MySQL's default): CLIENT_FOUND_ROWS on both engines.
    command = _command_engine(migrated_engine)
    try:
        assert _rowcount_of_an_update_that_changes_nothing(command) == 1
        assert _rowcount_of_an_update_that_changes_nothing(migrated_engine) == 1
    finally:
        command.dispose()


def test_each_in_process_command_opens_the_database_of_its_configuration(
        tmp_path, in_process, monkeypatch):  # noqa: F811 - the fixture
    # Before any test made the facade (the first test of a worker), an
    # in-process command runs on the command engine, as the real one does:
    # the engine of one command must not serve the next one's database.
    monkeypatch.setattr(db_api, '_facade', None)
    monkeypatch.setattr(db_api, '_command_engine', None)
    monkeypatch.setattr(db_api, '_command_engine_requested', False)
    migrated = []
    try:
        for name in ('first', 'second'):
            state = tmp_path / name
            state.mkdir()
            config = state / 'ic.conf'
            config.write_text(f'[DEFAULT]\nstate_path = {state}\n')
            code, _, err = in_process(manage.main, '--config-file',
                                      str(config), 'db', 'sync')
            assert code == 0, err
            with sa.create_engine(f'sqlite:///{state}/ironic_compute.sqlite'
                                  ).connect() as conn:
                migrated.append(sa.inspect(conn).has_table('locks'))
    finally:
        db_api.forget_command_engine()
    assert migrated == [True, True]
