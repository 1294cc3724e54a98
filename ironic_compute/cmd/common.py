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

"""What the commands share: parsing the configuration and failing in one line."""

import contextlib
import os
import re
import sys

from oslo_config import cfg
from oslo_db import exception as db_exc
from oslo_log import log as logging
from sqlalchemy import exc as sa_exc

from ironic_compute import conf as ic_conf
from ironic_compute import exception
from ironic_compute import text
from ironic_compute.conf import database as ic_database
from ironic_compute.conf import validation

CONF = ic_conf.CONF
PROJECT = 'ironic-compute'


def set_log_defaults(stderr=False, clients=True):
    """The options of the service and the log defaults of a command; set
    before parse_config(). ``clients``: see parse_config."""
    ic_conf.register_opts(CONF, clients=clients is True)
    logging.register_options(CONF)
    # alembic reports each plugin and step at INFO; --debug still shows them.
    logging.set_defaults(default_log_levels=(
        logging.get_default_log_levels() + ['alembic=WARN']))
    if stderr:
        CONF.set_default('use_stderr', True)


# oslo.config's own search path (cfg.find_config_files), for the message.
_SEARCHED = ('~/.' + PROJECT, '~', '/etc/' + PROJECT, '/etc')
# oslo.config also reads options from OS_<GROUP>__<OPTION> variables.
_ENV_OPTION = re.compile(r'^OS_[A-Z0-9_]+__[A-Z0-9_]+$')


def require_config(prog):
    """Refuse to run on defaults alone: say where files were looked for."""
    if (CONF.config_file or CONF.config_dir
            or any(_ENV_OPTION.match(name) for name in os.environ)):
        return
    names = ' and '.join(dict.fromkeys((f'{PROJECT}.conf', f'{prog}.conf')))
    where = ', '.join(os.path.expanduser(d) for d in _SEARCHED)
    raise exception.CommandError(f'no configuration file found: looked for {names} in '
                                 f'{where}; pass --config-file FILE')


def parse_config(argv, prog, default_config_files=None, prepare=None,
                 clients=True):
    """Parse the command line and config files, set up logging, validate.

    ``prepare``: see check_config (``db sync`` creates the default SQLite
    directory there). ``clients``: whether the options of the Ironic and
    Placement clients (keystoneauth's) are registered, and so validated;
    True, or a function of the parsed configuration (the command chosen)
    that says so.
    """
    ic_conf.register_opts(CONF, clients=clients is True)
    logging.register_options(CONF)
    CONF(argv, project=PROJECT, prog=prog,
         default_config_files=default_config_files)
    if clients is not True and clients(CONF):
        ic_conf.register_client_opts(CONF)
    require_config(prog)
    logging.setup(CONF, PROJECT)
    check_config(CONF, prepare)


def check_config(conf, prepare=None):
    """Validate a parsed configuration; InvalidConfig for the first problem.

    ``prepare(conf)`` runs after validation and before the database URL's
    checks.
    """
    validation.validate(conf)
    ic_database.use_installed_drivers(conf)
    if prepare is not None:
        prepare(conf)
    ic_database.check_sqlite_directory(conf)
    ic_database.create_sqlite_file(conf)


def _debug_requested():
    try:
        return bool(CONF.debug)
    except cfg.Error:
        return False


def driver_message(exc):
    """The message of the innermost error ``exc`` wraps, on one line."""
    # A DBAPI error carries the driver's own message; SQLAlchemy's wrapper
    # adds a statement dump and a link that do not help an operator.
    while True:
        inner = (getattr(exc, 'orig', None)
                 or getattr(exc, 'inner_exception', None))
        if inner is None or inner is exc:
            break
        exc = inner
    return text.one_line(exc)


def error_line(exc):
    """What an operator is told of ``exc``: one line, no secret."""
    if isinstance(exc, (db_exc.DBConnectionError, sa_exc.OperationalError)):
        return f'cannot connect to the database: {driver_message(exc)}'
    if isinstance(exc, (db_exc.DBError, sa_exc.SQLAlchemyError)):
        return f'database error: {driver_message(exc)}'
    # A file that does not parse is quoted by oslo.config, line and all.
    return validation.redact(driver_message(exc))


@contextlib.contextmanager
def one_line_errors(prog, exit_code=1):
    """Turn the errors an operator can fix into one line and ``exit_code``.

    With --debug the traceback is kept, for the cases where one line is not
    enough.
    """
    try:
        yield
    except (exception.CommandError, exception.InvalidConfig, cfg.Error,
            db_exc.DBError, sa_exc.SQLAlchemyError) as exc:
        if _debug_requested():
            raise
        print(f'{prog}: error: {error_line(exc)}', file=sys.stderr)
        sys.exit(exit_code)
