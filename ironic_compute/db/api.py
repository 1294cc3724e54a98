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

"""The one enginefacade of the project and the context that carries it.

Every query lives in a module of this package and runs inside
``context_manager.reader``/``writer``. The facade reads ``[database]`` of
``cfg.CONF`` when first used; tests point it at their own database with
``context_manager.patch_engine(engine)``.
"""

import functools

import sqlalchemy.exc as sa_exc
from oslo_db import api as oslo_db_api
from oslo_db import exception as db_exc
from oslo_db.sqlalchemy import enginefacade

from ironic_compute.db import idle_limit

context_manager = enginefacade.transaction_context()


def hide_parameters(engine):
    """Keep the values of a statement out of the messages of its errors
    (and out of SQLAlchemy's echo): they may be secrets, such as a rescue
    password in an instance's task_args, and an error's message reaches
    the log and a traceback. The statement itself is kept."""
    engine.hide_parameters = True


context_manager.append_on_engine_create(hide_parameters)
context_manager.append_on_engine_create(idle_limit.on_engine_create)

# Errors that mean "the database cannot be reached now": the daemon logs
# them as one line with since when, not a traceback; anything else keeps
# its traceback.
OUTAGE_ERRORS = (db_exc.DBConnectionError, db_exc.DBDeadlock,
                 sa_exc.OperationalError, sa_exc.InterfaceError,
                 sa_exc.TimeoutError)


@enginefacade.transaction_context_provider
class Context:
    """Carries the session of the current transaction."""


def get_engine():
    """The writer engine; starts the facade from cfg.CONF on first use."""
    return context_manager.writer.get_engine()


def _in_transaction(ctx):
    try:
        ctx.session  # noqa: B018 - raises when no transaction is open
    except (db_exc.NoEngineContextEstablished, db_exc.ContextNotRequestedError):
        return False
    return True


def _is_conflict(exc):
    # SQLite answers a writer that must wait for another one with "database
    # is locked", at once when the waiting transaction has read first. A
    # deadlock inside a savepoint ends the whole transaction on MariaDB, so
    # the rollback to the savepoint fails ("SAVEPOINT ... does not exist")
    # with the deadlock as its context: that is a conflict too.
    for _ in range(5):
        if exc is None:
            return False
        if (isinstance(exc, db_exc.DBDeadlock)
                or 'database is locked' in str(exc)):
            return True
        # What raised it, unless it said not to look (raise ... from None).
        exc = exc.__cause__ if exc.__cause__ is not None else (
            None if exc.__suppress_context__ else exc.__context__)
    return False


def retry_on_conflict(function=None, *, also=()):
    """Run a writer again when the database killed it to end a conflict.

    Services that start or claim rows together make MySQL/MariaDB pick
    deadlock victims and SQLite refuse a writer; the transaction is rolled
    back whole, so running it again is correct. ``also`` names further
    exceptions worth a retry (e.g. a unique row created meanwhile by the
    same statement elsewhere). Only the outermost transaction retries: an
    inner call cannot restart the transaction it runs in.
    """
    def decorate(func):
        retrying = oslo_db_api.wrap_db_retry(
            retry_interval=0.05, max_retries=10, max_retry_interval=2,
            inc_retry_interval=True, jitter=True,
            exception_checker=lambda exc: (_is_conflict(exc)
                                           or isinstance(exc, also)))(func)

        @functools.wraps(func)
        def wrapper(ctx, *args, **kwargs):
            if _in_transaction(ctx):
                return func(ctx, *args, **kwargs)
            return retrying(ctx, *args, **kwargs)
        return wrapper
    return decorate if function is None else decorate(function)


def writer(function=None, *, also=()):
    """A write transaction that runs again when the database ended it to
    resolve a conflict (see retry_on_conflict)."""
    def decorate(func):
        return retry_on_conflict(context_manager.writer(func), also=also)
    return decorate if function is None else decorate(function)
