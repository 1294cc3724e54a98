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

"""The instance commands import only what they use (issue 27 item 6).

Each command runs in a fresh process, which then lists the modules it
imported: a structural check, never a timing (tools/bench_cli.py measures
the time). The rings (numpy), the clients of Ironic and Placement
(keystoneauth1, requests, ironicclient), the daemon and the migrations cost
most of a second together, SQLAlchemy's ORM and oslo.db's facade a tenth
more, and an instance command needs none of them.
On SQLite only: what is checked is the imports of the command, not a query
(psycopg2 or pymysql would add a driver, the same for every command).
"""

import json
import os
import pathlib
import subprocess
import sys
import types
import uuid

import pytest
import sqlalchemy as sa

import ironic_compute
from ironic_compute.cmd import manage
from ironic_compute.cmd import manage_args
from ironic_compute.db import migration

# Neither these modules nor any module under them.
NOT_IMPORTED = (
    'numpy', 'keystoneauth1', 'requests', 'ironicclient', 'alembic',
    'oslo_service.service', 'oslo_upgradecheck',
    'ironic_compute.ring.hash_ring', 'ironic_compute.ring.assignment',
    'ironic_compute.ironic', 'ironic_compute.placement.client',
    'ironic_compute.daemon', 'ironic_compute.db.migration',
    # A command opens the database with db/command_engine.py: neither
    # SQLAlchemy's ORM nor oslo.db's facade and engine module (which
    # imports the ORM).
    'sqlalchemy.orm', 'oslo_db.sqlalchemy.enginefacade',
    'oslo_db.sqlalchemy.engines',
)
ROOT = pathlib.Path(ironic_compute.__file__).parent.parent

# Runs the command as ironic-compute-manage does, then prints the names of
# the modules loaded (on stdout's last line: the command prints first).
RUN = """
import json, sys
from ironic_compute.cmd import manage
try:
    code = manage.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({'code': code, 'modules': sorted(sys.modules)}))
"""


@pytest.fixture(scope='module')
def config(tmp_path_factory):
    """A config file naming a SQLite database at the newest schema."""
    workdir = tmp_path_factory.mktemp('startup')
    url = f'sqlite:///{workdir}/ic.sqlite'
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    migration.upgrade('head', engine=engine)
    engine.dispose()
    path = workdir / 'ic.conf'
    path.write_text(f'[DEFAULT]\nstate_path = {workdir}\n'
                    f'[database]\nconnection = {url}\n')
    return path


def run(config, *argv):
    """(exit code, modules loaded) of ironic-compute-manage ``argv`` run in
    a new process."""
    done = subprocess.run(
        [sys.executable, '-c', RUN, '--config-file', str(config), *argv],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, 'PYTHONPATH': str(ROOT)})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result['code'], set(result['modules'])


def heavy(modules):
    return sorted(m for m in modules
                  if any(m == n or m.startswith(n + '.') for n in NOT_IMPORTED))


@pytest.mark.parametrize('argv, exit_code', [
    (('instance', 'list'), 0),
    (('instance', 'show', str(uuid.uuid4())), 1),  # no such instance
    (('instance', 'create', '--name', 'a', '--resource-class', 'rc'), 1),  # no service
])
def test_an_instance_command_imports_no_ring_client_or_daemon(config, argv,
                                                              exit_code):
    code, modules = run(config, *argv)
    assert code == exit_code
    assert 'ironic_compute.db.instances' in modules  # it ran its query
    assert heavy(modules) == []


# As the console script runs the command (its name in argv[0]): whether the
# collector was on after the imports, and after the command.
CONSOLE = """
import gc, json, sys
sys.argv[0] = '/usr/bin/ironic-compute-manage'
from ironic_compute.cmd import manage
imported = gc.isenabled()
code = manage.main(sys.argv[1:])
print(json.dumps([imported, gc.isenabled(), gc.get_freeze_count() > 0, code]))
"""


def test_the_collector_waits_for_the_imports_of_the_console_script(config):
    done = subprocess.run(
        [sys.executable, '-c', CONSOLE, '--config-file', str(config), 'instance', 'list'],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, True, True, 0]


# As the console script runs the command: which of the modules oslo.config
# and oslo.log import without using them were loaded by the end (their code ran), and
# whether the command still parsed its configuration and answered.
DEFERRED = """
import json, sys
sys.argv[0] = '/usr/bin/ironic-compute-manage'
from ironic_compute.cmd import deferred_imports, manage
code = manage.main(sys.argv[1:])
print(json.dumps([code, sorted(
    name for name in deferred_imports.OSLO_EXTRAS
    if type(sys.modules.get(name)) is not deferred_imports._DeferredModule)]))
"""


def test_the_console_script_loads_no_module_oslo_imports_unused(config):
    done = subprocess.run(
        [sys.executable, '-c', DEFERRED, '--config-file', str(config), 'instance', 'list'],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, []]


def test_a_process_that_imports_the_commands_keeps_its_collector():
    # A test or a tool (argv[0] is not the console script's).
    done = subprocess.run(
        [sys.executable, '-c', 'import gc; from ironic_compute.cmd import manage; '
         'print(gc.isenabled())'], capture_output=True, text=True, check=True,
        cwd=ROOT, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert done.stdout.strip() == 'True'


def test_the_check_sees_a_command_that_needs_a_client(config):
    # The same check on a command that reads the options of the clients
    # (keystoneauth's): they and their library are there.
    code, modules = run(config, 'ironic', 'shards')
    assert 'keystoneauth1' in heavy(modules)


def test_the_daemon_still_opens_the_database_with_oslo_dbs_facade(config):
    # Without use_command_engine() (only ironic-compute-manage asks for it).
    done = subprocess.run(
        [sys.executable, '-c', DAEMON_ENGINE, str(config)], capture_output=True,
        text=True, check=True, cwd=ROOT, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert done.stdout.split() == ['True', '0']


# The engine a process gets when it did not ask for the command engine,
# and a query on it.
DAEMON_ENGINE = """
import sys
from ironic_compute import conf as ic_conf
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
ic_conf.register_opts(ic_conf.CONF)
ic_conf.CONF(['--config-file', sys.argv[1]], project='ironic-compute')
rows = db_instances.list_instances(db_api.Context())
print('oslo_db.sqlalchemy.enginefacade' in sys.modules, len(rows))
"""


def test_only_the_commands_that_talk_to_a_service_check_its_client_options(
        config, tmp_path):
    # keystoneauth's options of [ironic] (timeout among them) are registered,
    # and so checked, only for the commands that talk to Ironic or Placement.
    bad = tmp_path / 'bad.conf'
    bad.write_text(config.read_text() + '[ironic]\ntimeout = soon\n')
    assert run(bad, 'instance', 'list')[0] == 0
    assert run(bad, 'ironic', 'shards')[0] == 1


class _Commands:
    """A category of WITHOUT_CLIENTS with one action that talks to Ironic."""

    @manage_args.uses_clients
    def console(self):
        """Talks to Ironic."""

    def list(self):
        """Reads the database only."""


@pytest.mark.parametrize('category, action, registered', [
    ('instance', 'console', True),
    ('instance', 'list', False),
    ('ironic', 'shards', True),
])
def test_an_action_marked_uses_clients_gets_their_options(monkeypatch, category,
                                                          action, registered):
    monkeypatch.setitem(manage.CATEGORIES, 'instance', _Commands)
    conf = types.SimpleNamespace(category=types.SimpleNamespace(
        name=category, action_fn=action))
    assert manage._needs_clients(conf) is registered


def test_instance_create_loads_the_placement_client_only_with_placement(
        config, tmp_path):
    # With [placement] set, create claims (keystoneauth's options and the
    # client are loaded: it fails on no service before any request); the
    # other instance commands still load neither.
    placed = tmp_path / 'placed.conf'
    placed.write_text(config.read_text() + '[placement]\nauth_type = '
                      'admin_token\nendpoint = http://127.0.0.1:9\n'
                      'token = admin\n')
    code, modules = run(placed, 'instance', 'create', '--name', 'a',
                        '--resource-class', 'rc')
    assert code == 1
    assert 'ironic_compute.placement.client' in heavy(modules)
    code, modules = run(placed, 'instance', 'list')
    assert (code, heavy(modules)) == (0, [])
