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

"""ironic-compute-manage: administrative commands."""

# ruff: noqa: E402 - the collector is set before the other imports.

import gc
import os
import sys

PROG = 'ironic-compute-manage'

# The imports of a command make a few hundred thousand objects that live as
# long as the process, and the cyclic garbage collector would scan them
# again and again while they are made: a sixth of the imports' time. In the
# process the console script started (not in one that imports this module:
# a test, a tool), it is off while the commands are imported; main()
# freezes what is loaded then (out of every later scan) and turns it back
# on.
_collector_paused = os.path.basename(sys.argv[0]) == PROG
if _collector_paused:
    gc.disable()
    # And what oslo.config and oslo.log import without using it in a
    # command is loaded on first use (cmd/deferred_imports.py).
    from ironic_compute.cmd import deferred_imports
    deferred_imports.defer()

from oslo_config import cfg

from ironic_compute import exception
from ironic_compute.cmd import common
from ironic_compute.cmd import manage_args
from ironic_compute.cmd.manage_instance import InstanceCommands
from ironic_compute.cmd.manage_ironic import IronicCommands
from ironic_compute.cmd.manage_node import NodeCommands
from ironic_compute.cmd.manage_placement import PlacementCommands
from ironic_compute.cmd.manage_ring import RingCommands
from ironic_compute.cmd.manage_service import ServiceCommands
from ironic_compute.conf import database as ic_database
from ironic_compute.db import api as db_api

CONF = common.CONF


def _prepare(conf):
    # db sync of the embedded default creates state_path, which a fresh
    # install may not have yet; any other missing directory is a typo that
    # common.parse_config refuses.
    if (conf.category.name, conf.category.action_fn) != ('db', 'sync'):
        return
    directory = ic_database.sqlite_directory(conf)
    if directory is not None and directory == os.path.abspath(conf.state_path):
        ic_database.make_private_directory(directory)


class DbCommands:
    """The database schema."""

    # The migrations (alembic, half a second to import) are loaded only by
    # the commands that use them.

    def sync(self):
        """Upgrade the database schema to the newest version."""
        from ironic_compute.db import migration
        try:
            result = migration.sync()
        except exception.SchemaError as exc:
            raise exception.CommandError(str(exc)) from exc
        if result.state == 'newer':
            print(f'{result.message()}; nothing to do')
        else:
            print(f'database schema is at version {result.current}')

    def version(self):
        """Print the schema version of the database."""
        from ironic_compute.db import migration
        current = migration.version()
        print(current if current else 'None (run "db sync")')


CATEGORIES = {
    'db': DbCommands,
    'service': ServiceCommands,
    'ring': RingCommands,
    'node': NodeCommands,
    'instance': InstanceCommands,
    'ironic': IronicCommands,
    'placement': PlacementCommands,
}
# The categories whose commands talk to neither Ironic nor Placement: they
# run without keystoneauth's options of [ironic] and [placement] (whose
# loading costs a tenth of a second; see "Start-up" in doc/cli.md), but for
# an action marked @manage_args.uses_clients (or uses_clients_if, whose
# predicate holds: instance create with [placement]). Any other category gets them,
# and they are validated as the daemon does.
WITHOUT_CLIENTS = ('db', 'instance', 'ring', 'service')


def _needs_clients(conf):
    """Whether the chosen action reads the options of the clients."""
    name = conf.category.name
    action = getattr(CATEGORIES[name], conf.category.action_fn)
    uses = getattr(action, 'uses_clients', False)
    return name not in WITHOUT_CLIENTS or (uses(conf) if callable(uses)
                                           else uses)


def _summary(obj):
    # The first line of a docstring is the help of a category or action.
    return obj.__doc__.strip().splitlines()[0] if obj.__doc__ else None


def add_command_parsers(subparsers):
    for name, category in CATEGORIES.items():
        parser = subparsers.add_parser(name, help=_summary(category))
        actions = parser.add_subparsers(dest='action', metavar='ACTION')
        actions.required = True
        for action in sorted(a for a in vars(category) if not a.startswith('_')):
            method = getattr(category, action)
            sub = actions.add_parser(action.replace('_', '-'),
                                     help=_summary(method),
                                     description=method.__doc__)
            for args, kwargs in getattr(method, 'args', ()):
                sub.add_argument(*args, **kwargs)
            sub.set_defaults(action_fn=action)


category_opt = cfg.SubCommandOpt('category', title='Command categories',
                                 help='Available categories',
                                 handler=add_command_parsers)


def main(argv=None):
    global _collector_paused
    if _collector_paused:
        _collector_paused = False
        gc.freeze()
        gc.enable()
    argv = sys.argv[1:] if argv is None else argv
    CONF.register_cli_opt(category_opt)
    # Command output goes to stdout, log lines to stderr: output can be
    # piped.
    common.set_log_defaults(stderr=True, clients=_needs_clients)
    # An admin command should fail fast on an unreachable database rather
    # than retry for minutes as the daemon does at start-up.
    CONF.set_default('max_retries', 0, group='database')
    # A command opens the database without oslo.db's facade, whose import
    # (SQLAlchemy's ORM) would be a quarter of its start-up: the same
    # settings and errors (db/command_engine.py).
    db_api.use_command_engine()
    with common.one_line_errors(PROG):
        common.parse_config(argv, PROG, prepare=_prepare,
                            clients=_needs_clients)
        category = CATEGORIES[CONF.category.name]()
        action = getattr(category, CONF.category.action_fn)
        try:
            return action(**manage_args.values(action, CONF.category)) or 0
        except exception.AdminError as exc:
            raise exception.CommandError(str(exc)) from exc
        except BrokenPipeError:
            # The reader left (| head): not an error of ours; keep Python
            # from failing again when it flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1


if __name__ == '__main__':
    sys.exit(main())
