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

"""state_path and the embedded SQLite file are their owner's alone."""

import os
import stat

import pytest
from oslo_config import cfg

from ironic_compute import conf as ic_conf
from ironic_compute.conf import database


@pytest.fixture
def open_umask():
    """The widest umask: what is private is so by our mode, not by luck."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def conf_for(connection):
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    conf([], project='ironic-compute', default_config_files=[])
    conf.set_override('connection', connection, group='database')
    return conf


def test_a_new_state_directory_is_0700(tmp_path, open_umask):
    state = tmp_path / 'var' / 'lib' / 'ic'
    database.make_private_directory(str(state))
    assert mode(state) == 0o700
    # One that exists is the operator's: left as it is.
    os.chmod(state, 0o755)
    database.make_private_directory(str(state))
    assert mode(state) == 0o755


def test_a_new_sqlite_file_is_0600(tmp_path, open_umask):
    path = tmp_path / 'ic.sqlite'
    conf = conf_for(f'sqlite:///{path}')
    database.create_sqlite_file(conf)
    assert mode(path) == 0o600 and path.stat().st_size == 0
    os.chmod(path, 0o640)
    database.create_sqlite_file(conf)
    assert mode(path) == 0o640


@pytest.mark.parametrize('connection', [
    'sqlite://', 'sqlite:///:memory:',
    'mysql+pymysql://u:p@127.0.0.1/ic'])
def test_no_file_for_other_databases(tmp_path, connection, monkeypatch):
    monkeypatch.chdir(tmp_path)
    database.create_sqlite_file(conf_for(connection))
    assert list(tmp_path.iterdir()) == []
