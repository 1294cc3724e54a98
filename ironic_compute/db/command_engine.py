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

"""The engine of a short-lived command (ironic-compute-manage).

oslo.db's engine module imports SQLAlchemy's ORM (through its utilities),
a tenth of a second a command spends before its first statement. This
module makes the engine with SQLAlchemy alone, from the same ``[database]``
options, and gives it what oslo.db gives each backend's connections, so
that the server sees the same session either way:

* every backend: oslo.db's translation of errors (DBDuplicateEntry,
  DBDeadlock, DBConnectionError, ...), ``pool_pre_ping``, the pool options,
  ``connection_debug``, ``connection_parameters``, and ``max_retries`` /
  ``retry_interval`` for the first connection;
* MySQL/MariaDB: ``charset=utf8`` unless the URL names one, and
  ``mysql_sql_mode`` (TRADITIONAL by default) and ``mysql_wsrep_sync_wait``
  on every connection, with the warning on a non-strict mode;
* PostgreSQL: ``client_encoding=utf8`` unless the URL names one;
* SQLite: no pool for a file (a new connection per transaction), one
  shared connection for memory; the driver's own transaction handling off,
  and a plain BEGIN emitted by SQLAlchemy instead (what savepoints need);
  ``sqlite_synchronous``; foreign keys as oslo.db leaves them (not
  enforced).

Left out, as a command neither forks nor runs threads: oslo.db's guard
against a connection shared with a child process, the yield on check-in,
and ``connection_trace``. A test on every backend compares the sessions
this engine and oslo.db's open (tests/unit/db/test_command_engine.py).
"""

import logging
import time

import sqlalchemy as sa
from oslo_config import cfg
from oslo_db import exception as db_exc
from oslo_db.sqlalchemy import exc_filters
from sqlalchemy import pool as sa_pool

LOG = logging.getLogger(__name__)


def _url(options):
    if not options.connection:
        raise db_exc.CantStartEngineError('[database]connection is not set')
    url = sa.engine.make_url(options.connection)
    if options.connection_parameters:
        url = url.update_query_string(options.connection_parameters, append=True)
    return url


def _engine_args(url, options):
    """SQLAlchemy's create_engine arguments for ``url``."""
    args = {'pool_recycle': options.connection_recycle_time,
            'pool_pre_ping': True, 'connect_args': {}}
    pool_class = url.get_dialect().get_pool_class(url)
    backend = url.get_dialect().name
    if backend == 'sqlite':
        if issubclass(pool_class, sa_pool.SingletonThreadPool):
            # Memory: one connection, whatever the thread.
            args['poolclass'] = sa_pool.StaticPool
            args['connect_args'].update(check_same_thread=False,
                                        cached_statements=0)
        else:
            args['poolclass'] = sa_pool.NullPool
        return args
    if issubclass(pool_class, sa_pool.QueuePool):
        for option, arg in (('max_pool_size', 'pool_size'),
                            ('max_overflow', 'max_overflow'),
                            ('pool_timeout', 'pool_timeout')):
            if getattr(options, option) is not None:
                args[arg] = getattr(options, option)
    if backend == 'postgresql' and 'client_encoding' not in url.query:
        args['client_encoding'] = 'utf8'
    if backend == 'mysql' and 'charset' not in url.query:
        args['connect_args']['charset'] = 'utf8'
    return args


def _mysql_session(engine, options):
    def set_variables(dbapi_connection, record):
        cursor = dbapi_connection.cursor()
        if options.mysql_sql_mode is not None:
            cursor.execute('SET SESSION sql_mode = %s', [options.mysql_sql_mode])
        if options.mysql_wsrep_sync_wait is not None:
            cursor.execute('SET SESSION wsrep_sync_wait = %s',
                           [options.mysql_wsrep_sync_wait])
        cursor.close()

    def check_mode(dbapi_connection, record):
        # The first connection: "connect" has not run for it yet.
        set_variables(dbapi_connection, record)
        cursor = dbapi_connection.cursor()
        cursor.execute("SHOW VARIABLES LIKE 'sql_mode'")
        found = cursor.fetchone()
        cursor.close()
        mode = (found[1] if found else '').upper()
        if 'TRADITIONAL' not in mode and 'STRICT_ALL_TABLES' not in mode:
            LOG.warning('MySQL SQL mode is %r, consider enabling TRADITIONAL '
                        'or STRICT_ALL_TABLES', mode)

    sa.event.listen(engine, 'connect', set_variables)
    sa.event.listen(engine, 'first_connect', check_mode)


def _sqlite_session(engine, options):
    # pysqlite opens and ends transactions on its own, around some
    # statements only: a SAVEPOINT or a read would run outside the
    # transaction. Its handling is off, and the "begin" of SQLAlchemy
    # emits BEGIN.
    def on_connect(dbapi_connection, record):
        if not options.sqlite_synchronous:
            dbapi_connection.execute('PRAGMA synchronous = OFF')
        dbapi_connection.isolation_level = None

    def begin(connection):
        connection.exec_driver_sql('BEGIN')

    sa.event.listen(engine, 'connect', on_connect)
    sa.event.listen(engine, 'begin', begin)


def _connect_first(engine, options):
    """Open a first connection, ``max_retries`` times at most (-1: until
    it works), ``retry_interval`` apart; the last error when none worked.
    0: none is opened here."""
    attempt = 0
    while options.max_retries == -1 or attempt < options.max_retries:
        attempt += 1
        try:
            engine.connect().close()
            return
        except db_exc.DBConnectionError:
            if attempt == options.max_retries:
                raise
            LOG.warning('SQL connection failed. %s attempts left.',
                        'unlimited' if options.max_retries == -1
                        else options.max_retries - attempt)
            time.sleep(options.retry_interval)


def _log_level(connection_debug):
    if connection_debug >= 100:
        return logging.DEBUG
    return logging.INFO if connection_debug >= 50 else logging.WARNING


def create(hooks=(), conf=None):
    """A new engine for ``[database]`` of ``conf`` (cfg.CONF), after
    ``hooks(engine)``; CantStartEngineError without a connection URL,
    DBConnectionError when ``max_retries`` attempts to connect failed."""
    options = (conf or cfg.CONF).database
    url = _url(options)
    logging.getLogger('sqlalchemy.engine').setLevel(
        _log_level(options.connection_debug))
    engine = sa.create_engine(url, **_engine_args(url, options))
    if engine.dialect.name == 'mysql':
        _mysql_session(engine, options)
    elif engine.dialect.name == 'sqlite':
        _sqlite_session(engine, options)
    exc_filters.register_engine(engine)
    _connect_first(engine, options)
    for hook in hooks:
        hook(engine)
    return engine
