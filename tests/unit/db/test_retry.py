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

"""db_api.retry_on_conflict: which errors run a writer again, and where."""

import pytest
from oslo_db import exception as db_exc
from sqlalchemy import exc as sa_exc

from ironic_compute.db import api as db_api


def flaky(errors):
    """A writer that raises each of ``errors`` in turn, then returns 'done'."""
    calls = []

    @db_api.retry_on_conflict
    @db_api.context_manager.writer
    def write(ctx):
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return 'done'
    return write, calls


def locked():
    return sa_exc.OperationalError('BEGIN', {}, Exception('database is locked'))


def test_deadlock_victim_runs_again(sqlite_engine):
    write, calls = flaky([db_exc.DBDeadlock(), db_exc.DBDeadlock()])
    assert write(db_api.Context()) == 'done'
    assert len(calls) == 3


def test_sqlite_writer_refused_runs_again(sqlite_engine):
    write, calls = flaky([locked()])
    assert write(db_api.Context()) == 'done'
    assert len(calls) == 2


def savepoint_gone():
    """What MariaDB answers the rollback to a savepoint once a deadlock
    inside it ended the whole transaction: the deadlock is its context."""
    try:
        try:
            raise db_exc.DBDeadlock()
        except db_exc.DBDeadlock:
            raise db_exc.DBError('SAVEPOINT sa_savepoint_1 does not exist')  # noqa: B904 - the implicit context, as the driver leaves it
    except db_exc.DBError as exc:
        return exc


def test_a_savepoint_ended_by_a_deadlock_runs_again(sqlite_engine):
    write, calls = flaky([savepoint_gone()])
    assert write(db_api.Context()) == 'done'
    assert len(calls) == 2


def test_other_errors_are_not_retried(sqlite_engine):
    write, calls = flaky([db_exc.DBDuplicateEntry()])
    with pytest.raises(db_exc.DBDuplicateEntry):
        write(db_api.Context())
    assert len(calls) == 1


def test_extra_errors_can_be_retried(sqlite_engine):
    calls = []

    @db_api.retry_on_conflict(also=db_exc.DBDuplicateEntry)
    @db_api.context_manager.writer
    def write(ctx):
        calls.append(1)
        if len(calls) == 1:
            raise db_exc.DBDuplicateEntry()
        return 'done'
    assert write(db_api.Context()) == 'done'


def test_gives_up_after_the_last_retry(sqlite_engine, monkeypatch):
    monkeypatch.setattr('time.sleep', lambda seconds: None)
    write, calls = flaky([db_exc.DBDeadlock()] * 50)
    with pytest.raises(db_exc.DBDeadlock):
        write(db_api.Context())
    assert len(calls) == 11  # the first try and ten retries


def test_inner_call_does_not_retry_inside_the_outer_transaction(sqlite_engine):
    # The database rolled the whole transaction back: only its owner may
    # start it again.
    write, calls = flaky([db_exc.DBDeadlock()])
    ctx = db_api.Context()
    with pytest.raises(db_exc.DBDeadlock):
        with db_api.context_manager.writer.using(ctx):
            write(ctx)
    assert len(calls) == 1
