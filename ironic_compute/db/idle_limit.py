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

"""A transaction left idle is ended by the database server.

A service frozen inside a transaction (SIGSTOP, a paused VM, a debugger)
keeps its row locks for as long as its connection lives, and the kernel of
its host keeps that connection alive. Its peers wait on those locks. On
MariaDB that includes every takeover of the frozen host: the takeover's
UPDATE reads the services table in its condition, and an UPDATE takes
shared locks on the rows it reads there, so a heartbeat frozen between its
UPDATE and its COMMIT holds every takeover of its host until it resumes.

PostgreSQL and MariaDB end a session that stays idle inside a transaction
for longer than a limit: the transaction is rolled back and its locks are
released, and the frozen service's next statement fails as a lost
connection when it resumes (an outage it logs and recovers from). Each
connection of the service gets ``[database]idle_transaction_timeout`` when
it is opened. MySQL has no such limit and SQLite has one writer at a time
and no server.
"""

import sqlalchemy as sa
from oslo_config import cfg
from oslo_log import log as logging

from ironic_compute.conf import database as database_conf

LOG = logging.getLogger(__name__)

# Where a connection records its limit (seconds), for a statement that
# changes it for one transaction and must restore it (db/locks.py).
INFO_KEY = 'ironic_compute.idle_transaction_timeout'


def statement(dialect, seconds):
    """The SET that limits a session's idle time in a transaction to
    ``seconds`` on ``dialect``, or None where the server has no limit."""
    if dialect.name == 'postgresql':
        return f'SET SESSION idle_in_transaction_session_timeout = {int(seconds * 1000)}'
    if dialect.name == 'mysql' and getattr(dialect, 'is_mariadb', False):
        return f'SET SESSION idle_transaction_timeout = {max(1, int(seconds))}'
    return None


def limit(engine, seconds):
    """Give every connection ``engine`` opens from now on the limit
    ``seconds`` (0: none), where its server has one.

    The connections the pool holds already (oslo.db tests one when it
    creates the engine) are closed, so that none is without the limit.
    Whether a MySQL server is MariaDB is known once the first connection
    is open: the choice is made for each connection.
    """
    if not seconds or engine.dialect.name not in ('postgresql', 'mysql'):
        return
    warned = []

    def on_connect(dbapi_connection, record):
        text = statement(engine.dialect, seconds)
        if text is None:
            if not warned:
                warned.append(True)
                LOG.warning('[database]idle_transaction_timeout needs MariaDB '
                            'or PostgreSQL; this MySQL server ends no idle '
                            'transaction')
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(text)
        finally:
            cursor.close()
        # PostgreSQL runs the SET in a transaction of its own: a rollback
        # of it would undo the SET.
        dbapi_connection.commit()
        record.info[INFO_KEY] = seconds

    sa.event.listen(engine, 'connect', on_connect)
    engine.pool.dispose()


def on_engine_create(engine):
    """The hook every engine of the project gets (db_api.ON_ENGINE_CREATE):
    the limit of ``cfg.CONF``, or the option's default where a tool made
    the engine without registering it."""
    try:
        seconds = cfg.CONF.database.idle_transaction_timeout
    except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
        seconds = database_conf.IDLE_TRANSACTION_TIMEOUT
    limit(engine, seconds)


def configured(connection):
    """The limit of ``connection`` (a SQLAlchemy Connection), or None."""
    return connection.info.get(INFO_KEY)
