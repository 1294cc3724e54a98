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

"""[database] options: oslo.db's, with an embedded SQLite default.

A URL without a driver (``postgresql://``, ``mysql://``) is what most
people write; SQLAlchemy then picks a driver this project does not install
(psycopg 3, MySQLdb). ``use_installed_drivers`` names the installed ones.
"""

import os

from oslo_config import cfg
from oslo_db import options as db_options
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from ironic_compute import exception

# The default lets a single service run without a database server; several
# services on several hosts need a shared MySQL/MariaDB or PostgreSQL.
DEFAULT_CONNECTION = 'sqlite:///$state_path/ironic_compute.sqlite'
# The drivers of requirements.txt, for URLs that name none.
DRIVERS = {'postgresql': 'psycopg2', 'mysql': 'pymysql', 'mariadb': 'pymysql'}
_URL_OPTIONS = ('connection', 'slave_connection')
_EXAMPLE = ('write mysql+pymysql://USER:PASSWORD@HOST/DB, '
            'postgresql+psycopg2://USER:PASSWORD@HOST/DB or sqlite:///PATH')


IDLE_TRANSACTION_TIMEOUT = 30
# Our own option in oslo.db's group: it is about the same connections.
database_opts = [
    cfg.IntOpt(
        'idle_transaction_timeout',
        default=IDLE_TRANSACTION_TIMEOUT,
        min=0,
        help='Seconds a connection of this service may stay idle inside a '
             'transaction before the database server ends it, rolling the '
             'transaction back and releasing its locks. A service frozen in '
             'a transaction (SIGSTOP, a paused VM) would otherwise hold its '
             'row locks, and with them its peers, until it resumes: on '
             'MariaDB even the takeover of its instances. The service\'s own '
             'transactions are short and never wait on Ironic. PostgreSQL '
             '(idle_in_transaction_session_timeout) and MariaDB '
             '(idle_transaction_timeout) only; 0 sets no limit.'),
]


def register_opts(conf):
    db_options.set_defaults(conf, connection=DEFAULT_CONNECTION)
    conf.register_opts(database_opts, group='database')


def list_opts():
    groups = dict(db_options.list_opts())  # copies of oslo.db's options
    for opts in groups.values():
        cfg.set_defaults(opts, connection=DEFAULT_CONNECTION)
    groups['database'] = groups.get('database', []) + database_opts
    return groups


def _parse(name, value):
    """The URL of option ``name``; InvalidConfig without echoing it.

    The value may hold a password, so no message quotes it.
    """
    try:
        url = make_url(value)
    except (sa_exc.ArgumentError, ValueError):
        raise exception.InvalidConfig(
            f'[database]{name} is not a database URL: {_EXAMPLE}') from None
    try:
        dialect = url.get_dialect()
    except sa_exc.NoSuchModuleError:
        raise exception.InvalidConfig(
            f'[database]{name}: unknown database type '
            f'{url.get_backend_name()!r}: {_EXAMPLE}') from None
    if url.get_backend_name() != 'sqlite' and not url.database:
        # MySQL would fail on the first query with a bare AssertionError.
        raise exception.InvalidConfig(
            f'[database]{name} names no database: end it with /DBNAME')
    try:
        dialect.import_dbapi()
    except ImportError:
        raise exception.InvalidConfig(
            f'[database]{name} asks for the driver {url.get_driver_name()!r}'
            f', which is not installed: {_EXAMPLE}') from None
    return url


def with_driver(value):
    """``value`` with the installed driver when it names none."""
    url = make_url(value)
    driver = DRIVERS.get(url.drivername)
    if driver is None:
        return value
    return url.set(drivername=f'{url.drivername}+{driver}').render_as_string(
        hide_password=False)


def use_installed_drivers(conf):
    """Point driverless URLs at the installed drivers; check every URL."""
    for name in _URL_OPTIONS:
        value = conf.database[name]
        if not value:
            continue
        if '://' in value:
            fixed = with_driver(value)
            if fixed != value:
                # oslo.config substitutes $name in overrides as well.
                conf.set_override(name, fixed.replace('$', '$$'),
                                  group='database')
                value = fixed
        _parse(name, value)


def sqlite_directory(conf):
    """The directory of a file-based SQLite connection, else None."""
    path = sqlite_file(conf)
    return os.path.dirname(path) if path is not None else None


# The state and the embedded database are the service's alone: the
# database holds the instances and who manages them.
PRIVATE_DIRECTORY = 0o700
PRIVATE_FILE = 0o600


def make_private_directory(path):
    """Create ``path`` (and its parents) if missing, the last one 0700."""
    if os.path.isdir(path):
        return
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIRECTORY)
    except FileExistsError:
        return  # made meanwhile by another command: as it is
    # mkdir's mode is cut by the umask, never widened: set it exactly.
    os.chmod(path, PRIVATE_DIRECTORY)


def sqlite_file(conf):
    """The file of a file-based SQLite connection, else None."""
    url = make_url(conf.database.connection)
    if url.get_backend_name() != 'sqlite' or url.database in (None, '',
                                                              ':memory:'):
        return None
    return os.path.abspath(url.database)


def create_sqlite_file(conf):
    """Create a missing SQLite database file readable by its owner only.

    SQLite would create it on the first connection with the umask's mode
    (usually 0644), and its journal files take the database file's mode.
    An empty file is an empty SQLite database.
    """
    path = sqlite_file(conf)
    if path is None or os.path.exists(path):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         PRIVATE_FILE))
    except FileExistsError:
        pass  # made meanwhile by another command: as it is


def check_sqlite_directory(conf):
    """Refuse a SQLite file in a directory that does not exist.

    SQLite would say only "unable to open database file"; a typo in the
    path must not create directories either.
    """
    directory = sqlite_directory(conf)
    if directory is None or os.path.isdir(directory):
        return
    if directory == os.path.abspath(conf.state_path):
        hint = ('"ironic-compute-manage db sync" creates it with the '
                'database')
    else:
        hint = 'create it or correct the path'
    raise exception.InvalidConfig(
        f'[database]connection: the directory {directory} of the SQLite '
        f'database does not exist: {hint}')
