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

"""Fixtures of the command tests."""

import pytest
from oslo_config import cfg
from oslo_log import log as oslo_log

from ironic_compute.cmd import common
from ironic_compute.cmd import manage
from ironic_compute.db import api as db_api
from tests.unit.cmd import BASE_CONF
from tests.unit.cmd import Result


@pytest.fixture
def in_process(monkeypatch, capsys):
    """Run a command's ``main`` in this process: ``in_process(manage.main,
    '--config-file', path, 'db', 'sync')`` returns (exit code, stdout, stderr).

    What a real process shows (exit code, one line on stderr) without the
    two seconds a process start costs; tests/functional runs the real
    commands.
    """
    # The command's logging set-up would change the test process' loggers.
    monkeypatch.setattr(oslo_log, 'setup', lambda *a, **k: None)
    monkeypatch.setattr(oslo_log, 'set_defaults', lambda *a, **k: None)

    def forget():
        common.CONF.clear()
        # manage.main registers its sub-commands on the process-wide CONF;
        # another command would then require one.
        common.CONF.unregister_opt(manage.category_opt)
        # And ironic-compute-status (oslo.upgradecheck) its own.
        common.CONF.unregister_opt(cfg.SubCommandOpt('command'))
        # manage.main asks for the command engine, which db_api then keeps
        # for the process (one command in a real one): the next command
        # opens the database of its own configuration.
        db_api.forget_command_engine()

    def run(main, *argv):
        capsys.readouterr()
        forget()
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        finally:
            forget()
        out, err = capsys.readouterr()
        return code or 0, out, err

    yield run
    # What main() sets on the process-wide CONF, which outlives clear().
    common.CONF.clear_default('use_stderr')
    common.CONF.clear_default('max_retries', group='database')
    for name in ('connection', 'slave_connection'):  # use_installed_drivers
        common.CONF.clear_override(name, group='database')


@pytest.fixture
def cli(tmp_path, in_process):
    """ironic-compute-manage in this process: cli('service', 'list',
    conf='[section]\\n...') returns a Result; ``conf`` is added to
    BASE_CONF."""
    config = tmp_path / 'manage.conf'

    def run(*argv, conf=''):
        # state_path exists: the default SQLite URL passes the directory
        # check (the facade is patched to the test database anyway).
        config.write_text(f'[DEFAULT]\nstate_path = {tmp_path}\n'
                          + BASE_CONF + conf)
        return Result(*in_process(manage.main, '--config-file', str(config),
                                  *argv))

    return run


@pytest.fixture
def manage_cli(cli):
    """The ``cli`` fixture under the name the instance command tests use."""
    return cli


@pytest.fixture
def instance(migrated_engine):
    """The uuid of an active instance of service cmp-1 on node 1, in the
    test database (the rescue, console and config drive commands')."""
    from tests.unit.cmd.test_instance_remove import built
    from tests.unit.cmd.test_manage_admin import instance_uuid
    from tests.unit.cmd.test_manage_admin import node_uuid
    from tests.unit.cmd.test_manage_admin import service
    service('cmp-1', node_uuid(1))
    uuid = instance_uuid(1)
    built(uuid, 'cmp-1', node_uuid(1))
    return uuid
