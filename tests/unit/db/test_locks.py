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

"""db/locks.held: the end of the lock's transaction, without a server.

A Galera node aborts a local transaction that conflicts with a write
certified on another node while the client is between two statements: it
rolls the transaction back and answers the next statement with a deadlock
error (1213). When that statement is the reset of the lock's session
bounds, swallowing the error let the COMMIT that follows succeed on an
empty transaction: ``instance create`` reported an instance that was never
written (tests/functional/test_galera.py found it).
"""

import types

import pytest
from oslo_db import exception as db_exc

from ironic_compute.db import idle_limit
from ironic_compute.db import locks as db_locks

RESET = 'SET SESSION innodb_lock_wait_timeout = DEFAULT'


class _Session:
    """A MariaDB connection that answers every statement; the reset of the
    bounds as told."""

    dialect = types.SimpleNamespace(name='mysql', is_mariadb=True)

    def __init__(self, reset_error=None, info=None):
        self.reset_error = reset_error
        self.statements = []
        self.info = info or {}

    def execute(self, statement, params=None):
        text = str(statement)
        self.statements.append(text)
        if text.startswith(RESET) and self.reset_error is not None:
            raise self.reset_error
        return types.SimpleNamespace(rowcount=1)


def _ctx(session):
    return types.SimpleNamespace(session=session)


def _aborted():
    return db_exc.DBDeadlock(Exception(
        '(1213, Deadlock found when trying to get lock; try restarting transaction)'))


def test_the_bounds_are_set_then_reset_in_the_transaction():
    session = _Session()
    with db_locks.held(_ctx(session), db_locks.SCHEDULER):
        session.execute('INSERT the request')
    assert session.statements[0].startswith('SET SESSION innodb_lock_wait_timeout = 5')
    assert session.statements[1].startswith('UPDATE locks')
    assert session.statements[2] == 'INSERT the request'
    assert session.statements[3] == (RESET + ', idle_transaction_timeout = DEFAULT')


def test_the_reset_restores_the_connections_own_idle_limit():
    # A connection opened with [database]idle_transaction_timeout keeps it
    # after the lock's shorter hold (db/idle_limit.py).
    session = _Session(info={idle_limit.INFO_KEY: 30})
    with db_locks.held(_ctx(session), db_locks.SCHEDULER):
        pass
    assert session.statements[0] == ('SET SESSION innodb_lock_wait_timeout = 5, '
                                     'idle_transaction_timeout = 10')
    assert session.statements[-1] == (RESET + ', idle_transaction_timeout = 30')


def test_a_transaction_the_server_ended_before_the_reset_is_not_reported_done():
    # The deadlock error reaches db_api.writer, which runs the whole
    # transaction again, instead of a COMMIT of nothing.
    session = _Session(reset_error=_aborted())
    with pytest.raises(db_exc.DBDeadlock):
        with db_locks.held(_ctx(session), db_locks.SCHEDULER):
            session.execute('INSERT the request')


def test_the_bodys_own_error_wins_over_a_failed_reset():
    session = _Session(reset_error=_aborted())
    with pytest.raises(ValueError, match='no room'):
        with db_locks.held(_ctx(session), db_locks.SCHEDULER):
            raise ValueError('no room')
    assert session.statements[-1].startswith(RESET)
