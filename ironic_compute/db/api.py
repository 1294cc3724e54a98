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

"""The transactions of the project, the context that carries them, and
the engine they run on.

Every query lives in a module of this package and runs inside
``context_manager.reader`` or ``writer`` (decorators of a function whose
first argument is a Context, or ``.using(ctx)`` around a block). A reader
or writer called inside an open transaction joins it; a writer inside a
reader is refused. ``ctx.session`` is the SQLAlchemy Connection of the
open transaction: Core statements, ``begin_nested()`` for a savepoint.

The engine: oslo.db's enginefacade makes it from ``[database]`` of
``cfg.CONF`` on first use (the daemon, the tools; tests point it at their
own database with ``facade().patch_factory(...)``). A short-lived command
asks for db/command_engine.py's instead (``use_command_engine()``): the same
settings toward the server, without the import of the ORM that oslo.db's
engine module pays (doc/cli.md, "Start-up"). Both get the hooks of
ON_ENGINE_CREATE, and the transactions are this module's either way.
"""

import contextlib
import functools
import logging as std_logging
import threading

import sqlalchemy.exc as sa_exc
from oslo_db import api as oslo_db_api
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.db import idle_limit
from ironic_compute.text import one_line


def hide_parameters(engine):
    """Keep the values of a statement out of the messages of its errors
    (and out of SQLAlchemy's echo): they may be secrets, such as a rescue
    password in an instance's task_args, and an error's message reaches
    the log and a traceback. The statement itself is kept."""
    engine.hide_parameters = True


# What every engine of the project gets when it is made, whoever makes it.
ON_ENGINE_CREATE = (hide_parameters, idle_limit.on_engine_create)

# Errors that mean "the database cannot be reached now": the daemon logs
# them as one line with since when, not a traceback; anything else keeps
# its traceback.
OUTAGE_ERRORS = (db_exc.DBConnectionError, db_exc.DBDeadlock,
                 sa_exc.OperationalError, sa_exc.InterfaceError,
                 sa_exc.TimeoutError)


class _OneLineResetErrors(std_logging.Filter):
    """SQLAlchemy rolls a connection back when a thread returns it to the
    pool. When the database went away meanwhile, that rollback fails, and
    SQLAlchemy logs it as an ERROR with a traceback, then drops the
    connection: nothing is lost, and the flow that used it has already
    logged the outage in one line. The same failure is logged here as one
    warning line, without the traceback."""

    def filter(self, record):
        if record.getMessage() == 'Exception during reset or similar':
            error = record.exc_info[1] if record.exc_info else None
            record.msg = ('A database connection could not be reset on its '
                          'return to the pool and is dropped: %s')
            record.args = (one_line(error) if error is not None else
                           'no error given',)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = std_logging.WARNING, 'WARNING'
        return True


# A logger's filter sees only what is logged to that very logger: each pool
# class logs under its own name.
for _pool in ('QueuePool', 'AsyncAdaptedQueuePool', 'NullPool',
              'SingletonThreadPool', 'StaticPool', 'AssertionPool'):
    std_logging.getLogger(f'sqlalchemy.pool.impl.{_pool}').addFilter(
        _OneLineResetErrors())

_lock = threading.Lock()
_facade = None
_command_engine = None
_command_engine_requested = False


def facade():
    """oslo.db's transaction context that makes the engine (imported and
    made on the first call, with the hooks of ON_ENGINE_CREATE)."""
    global _facade
    with _lock:
        if _facade is None:
            # Imported here: it imports SQLAlchemy's ORM, which a command
            # that asked for the command engine does without.
            from oslo_db.sqlalchemy import enginefacade
            made = enginefacade.transaction_context()
            for hook in ON_ENGINE_CREATE:
                made.append_on_engine_create(hook)
            _facade = made
        return _facade


def use_command_engine():
    """Open the database of this process with db/command_engine.py, not
    with oslo.db's facade: for a short-lived command. A facade made already
    (a test that pointed it at its database) still wins."""
    global _command_engine_requested
    _command_engine_requested = True


def forget_command_engine():
    """Dispose of the command engine, if one was made, and forget it and
    the request for it: the next command that asks for one makes its own.

    A real command is one process, whose command engine lasts as long as it
    does; only something that runs several commands in one process (the
    tests that call a command's ``main``) needs this, so that one command's
    engine does not serve the next one's database.
    """
    global _command_engine, _command_engine_requested
    with _lock:
        engine, _command_engine = _command_engine, None
        _command_engine_requested = False
    if engine is not None:
        engine.dispose()


def get_engine():
    """The engine the transactions run on; made from ``cfg.CONF`` on first
    use (see the module's docstring for which)."""
    global _command_engine
    if _command_engine_requested and _facade is None:
        with _lock:
            if _command_engine is None:
                from ironic_compute.db import command_engine
                _command_engine = command_engine.create(ON_ENGINE_CREATE)
            return _command_engine
    return facade().writer.get_engine()


class Context:
    """Carries the transaction open in this thread, if any."""

    def __init__(self):
        self._local = threading.local()

    @property
    def session(self):
        """The Connection of the open transaction; TransactionNotOpen
        outside one."""
        transaction = getattr(self._local, 'transaction', None)
        if transaction is None:
            raise exception.TransactionNotOpen('no transaction is open on this context')
        return transaction.connection


class _Transaction:
    def __init__(self, connection, writes):
        self.connection = connection
        self.writes = writes


class _Mode:
    """Reader (``writes`` false) or writer transactions."""

    def __init__(self, writes):
        self.writes = writes

    @contextlib.contextmanager
    def using(self, ctx):
        """Run the block in the transaction of ``ctx``, or in a new one
        that commits (a writer) or rolls back (a reader) at its end and
        rolls back on an error; yields ``ctx.session``. TypeError for a
        writer inside a reader."""
        open_ = getattr(ctx._local, 'transaction', None)
        if open_ is not None:
            if self.writes and not open_.writes:
                raise TypeError('a writer cannot run inside a reader transaction')
            yield open_.connection
            return
        with get_engine().connect() as connection:
            transaction = connection.begin()
            ctx._local.transaction = _Transaction(connection, self.writes)
            try:
                yield connection
            except BaseException:
                # The block's error is the one to see, whatever the
                # rollback says.
                with contextlib.suppress(Exception):
                    transaction.rollback()
                raise
            finally:
                ctx._local.transaction = None
            if self.writes:
                transaction.commit()
            else:
                transaction.rollback()

    def __call__(self, func):
        """Decorate ``func(ctx, ...)`` to run inside ``using(ctx)``."""
        @functools.wraps(func)
        def wrapper(ctx, *args, **kwargs):
            with self.using(ctx):
                return func(ctx, *args, **kwargs)
        return wrapper


class _Transactions:
    reader = _Mode(writes=False)
    writer = _Mode(writes=True)


# The readers and writers of every db module: @context_manager.reader,
# context_manager.writer.using(ctx) (a writer that retries: writer below).
context_manager = _Transactions()


def _in_transaction(ctx):
    return getattr(ctx._local, 'transaction', None) is not None


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
