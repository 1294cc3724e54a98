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

"""Rows that exist to be locked: a writer serialises on one by updating it.

A writer takes the lock by an UPDATE of its row, the first statement of its
transaction, and holds it until it commits. An UPDATE, unlike ``SELECT ...
FOR UPDATE``, is in the write set a Galera cluster certifies: two writers
on two nodes of a cluster cannot both commit; the second is aborted with a
deadlock error and runs again (``db_api.writer``).

The wait is bounded: a writer that cannot take the lock within
WAIT_SECONDS gives up with ``exception.LockBusy``. So is the hold: on
PostgreSQL and MariaDB the server ends the session of a holder that stays
idle in its transaction (a paused or stuck client) for HOLD_SECONDS, which
releases the lock. SQLite has one writer at a time anyway; the update takes it.
"""

import contextlib

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.db import clock
from ironic_compute.db import idle_limit
from ironic_compute.db import models

SCHEDULER = 'scheduler'
WAIT_SECONDS = 5
HOLD_SECONDS = 10

_locks = models.locks


def _is_lock_timeout(exc):
    text = str(exc)
    # MariaDB/MySQL error 1205; PostgreSQL's lock_timeout (55P03).
    return 'Lock wait timeout exceeded' in text or 'due to lock timeout' in text


def _bound(ctx, wait, hold):
    """Bound this transaction's lock wait and idle time; a reset or None."""
    session = ctx.session
    dialect = session.dialect
    if dialect.name == 'postgresql':
        # SET LOCAL: until this transaction ends.
        session.execute(sa.text(f'SET LOCAL lock_timeout = {int(wait * 1000)}'))
        session.execute(sa.text('SET LOCAL idle_in_transaction_session_timeout'
                                f' = {int(hold * 1000)}'))
        return None
    if dialect.name == 'mysql':
        names = ['innodb_lock_wait_timeout']
        values = [max(1, int(wait))]
        if getattr(dialect, 'is_mariadb', False):
            names.append('idle_transaction_timeout')
            values.append(max(1, int(hold)))
        session.execute(sa.text('SET SESSION ' + ', '.join(
            f'{name} = {value}' for name, value in zip(names, values, strict=True))))
        # Session variables outlive the transaction on a pooled connection:
        # back to the server's default, or to the connection's own limit
        # (db/idle_limit.py).
        restored = {'idle_transaction_timeout':
                    idle_limit.configured(session) or 'DEFAULT'}
        return 'SET SESSION ' + ', '.join(
            f'{name} = {restored.get(name, "DEFAULT")}' for name in names)
    return None


def _update(ctx, name):
    return ctx.session.execute(
        _locks.update().where(_locks.c.name == name)
        .values(generation=_locks.c.generation + 1,
                updated_at=clock.utc_now())).rowcount == 1


def _take(ctx, name, wait):
    try:
        if _update(ctx, name):
            return
        # The row is missing (it is made by migration 0010): make it, which
        # takes it; a writer that made it meanwhile has it, wait for it.
        try:
            with ctx.session.begin_nested():
                ctx.session.execute(_locks.insert().values(
                    name=name, generation=1, updated_at=clock.utc_now()))
            return
        except db_exc.DBDuplicateEntry:
            pass
        if not _update(ctx, name):
            raise RuntimeError(f'the lock row {name!r} cannot be made')
    # oslo.db wraps MariaDB's timeout (DBDeadlock), not PostgreSQL's.
    except (db_exc.DBError, sa.exc.DBAPIError) as exc:
        if not _is_lock_timeout(exc):
            raise
        raise exception.LockBusy(f'another request held the {name} lock for more than '
                                 f'{wait:g} s; try again') from None


@contextlib.contextmanager
def held(ctx, name, wait=None, hold=None):
    """Take the lock ``name`` in the transaction of ``ctx``, for its rest.

    Call it first in the transaction: on MariaDB the reads that follow
    then see what the previous holder committed.
    """
    wait = WAIT_SECONDS if wait is None else wait
    hold = HOLD_SECONDS if hold is None else hold
    reset = _bound(ctx, wait, hold)
    try:
        _take(ctx, name, wait)
        yield
    except BaseException:
        if reset is not None:
            # The transaction fails anyway: keep its own error.
            with contextlib.suppress(db_exc.DBError):
                ctx.session.execute(sa.text(reset))
        raise
    if reset is not None:
        # Never suppressed: an error here may say that the server ended the
        # transaction since its last statement (a Galera node aborts a
        # transaction that conflicts with a write certified on another node,
        # and answers its next statement with a deadlock error; MariaDB ends
        # one idle for longer than HOLD_SECONDS). Its writes are gone; the
        # COMMIT that followed a suppressed error would succeed on nothing
        # and the caller would report a write that never happened.
        ctx.session.execute(sa.text(reset))
