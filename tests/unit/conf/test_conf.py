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

"""Options, their validation, and the committed sample."""

import os
import subprocess
import sys

import pytest
from oslo_config import cfg
from sqlalchemy.engine import make_url

from ironic_compute import conf as ic_conf
from ironic_compute import exception
from ironic_compute.conf import database
from ironic_compute.conf import opts
from ironic_compute.conf import validation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SAMPLE = os.path.join(ROOT, 'etc', 'ironic-compute',
                      'ironic-compute.conf.sample')
GENERATOR = os.path.join(ROOT, 'etc', 'ironic-compute',
                         'ironic-compute-config-generator.conf')


@pytest.fixture
def conf():
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    return conf


@pytest.fixture
def load(conf, tmp_path):
    def load(text):
        path = tmp_path / 'ironic-compute.conf'
        path.write_text(text)
        conf(['--config-file', str(path)], project='ironic-compute')
        return conf
    return load


def test_defaults(conf):
    conf([], project='ironic-compute')
    validation.validate(conf)
    assert conf.host
    assert conf.report_interval < conf.service_down_time
    assert conf.graceful_shutdown_timeout == 60
    assert conf.ironic.service_type == 'baremetal'
    assert conf.ironic.timeout == 30
    assert conf.ironic.partition_key is None
    assert conf.ironic.peer_list == []
    assert conf.hash_ring.partition_exponent == 16
    assert conf.hash_ring.replicas == 1
    assert conf.max_concurrent_builds == 10
    assert conf.instance_takeover_grace == 600
    assert conf.instance_poll_interval == 0.2
    assert conf.ironic.deploy_timeout == 1800
    assert conf.database.connection == (
        'sqlite:///' + conf.state_path + '/ironic_compute.sqlite')


def test_every_option_has_help():
    for _group, group_opts in opts.list_opts():
        for opt in group_opts:
            assert opt.help, opt.name


def test_mutable_options():
    mutable = {(g if isinstance(g, str) else g.name, o.name)
               for g, group_opts in opts.list_opts() for o in group_opts
               if o.mutable}
    assert {('DEFAULT', 'update_resources_interval'),
            ('DEFAULT', 'instance_takeover_grace'),
            ('DEFAULT', 'instance_poll_interval'),
            ('ironic', 'partition_key'),
            ('ironic', 'peer_list')} <= mutable


def test_secrets_are_marked_secret():
    by_name = {o.name: o for _g, group_opts in opts.list_opts()
               for o in group_opts}
    assert by_name['password'].secret
    assert by_name['connection'].secret


def test_conductor_group_is_accepted_as_partition_key(load):
    conf = load('[ironic]\nconductor_group = rack-1\n')
    assert conf.ironic.partition_key == 'rack-1'


@pytest.mark.parametrize('key', ['rack 1', 'grp/1', 'a' * 256, 'é'])
def test_invalid_partition_key_is_one_clear_line(load, key):
    conf = load(f'[ironic]\npartition_key = {key}\n')
    with pytest.raises(exception.InvalidConfig) as exc:
        validation.validate(conf)
    message = str(exc.value)
    assert '\n' not in message
    assert message.startswith('invalid value for [ironic]partition_key in ')


@pytest.mark.parametrize('key', ['', 'rack-1', 'Group_2.a', 'a' * 255])
def test_valid_partition_keys(load, key):
    conf = load(f'[ironic]\npartition_key = {key}\n')
    validation.validate(conf)
    assert conf.ironic.partition_key == key


@pytest.mark.parametrize('text, option', [
    ('[DEFAULT]\nreport_interval = 0\n', '[DEFAULT]report_interval'),
    ('[DEFAULT]\nupdate_resources_interval = -5\n',
     '[DEFAULT]update_resources_interval'),
    ('[DEFAULT]\nservice_down_time = soon\n', '[DEFAULT]service_down_time'),
    ('[hash_ring]\nreplicas = 0\n', '[hash_ring]replicas'),
])
def test_bad_values_name_the_option(load, text, option):
    conf = load(text)
    with pytest.raises(exception.InvalidConfig, match=option.replace(
            '[', r'\[').replace(']', r'\]')):
        validation.validate(conf)


def test_down_time_must_exceed_report_interval(load):
    conf = load('[DEFAULT]\nreport_interval = 30\nservice_down_time = 30\n')
    with pytest.raises(exception.InvalidConfig,
                       match='service_down_time .30. must be larger'):
        validation.validate(conf)


@pytest.mark.parametrize('host, peers, refused', [
    ('C1 ', ' c1 ,C2', None),       # names compare without case or blanks
    ('c1', 'C1,,c2', None),          # an empty entry is dropped
    ('c1', 'c2, C3', "['c2', 'c3']"),  # the message shows the normalised list
])
def test_peer_list_must_hold_this_host(load, host, peers, refused):
    conf = load(f'[DEFAULT]\nhost = {host}\n[ironic]\nauth_type = none\n'
                f'partition_key = g\npeer_list = {peers}\n')
    if refused is None:
        validation.validate_service(conf)
        return
    with pytest.raises(exception.InvalidConfig, match='does not contain') as err:
        validation.validate_service(conf)
    assert refused in str(err.value) and "host 'c1'" in str(err.value)


def test_committed_sample_is_current(tmp_path):
    out = tmp_path / 'sample.conf'
    subprocess.run(
        [sys.executable, '-m', 'oslo_config.generator',
         '--config-file', GENERATOR, '--output-file', str(out)],
        check=True, cwd=ROOT)
    with open(SAMPLE) as committed:
        assert out.read_text() == committed.read(), (
            'etc/ironic-compute/ironic-compute.conf.sample is stale: '
            'run "tox -e genconfig" and commit the result')


@pytest.mark.parametrize('given, expected', [
    ('postgresql://u:p@db/ic', 'postgresql+psycopg2://u:p@db/ic'),
    ('mysql://u:p@db/ic?charset=utf8', 'mysql+pymysql://u:p@db/ic?charset=utf8'),
    ('mariadb://u@db:3307/ic', 'mariadb+pymysql://u@db:3307/ic'),
    # A password with URL-special characters survives the rewrite.
    ('mysql://u:p%40ss%2Fw@db/ic', 'mysql+pymysql://u:p%40ss%2Fw@db/ic'),
    ('mysql+pymysql://u:p@db/ic', 'mysql+pymysql://u:p@db/ic'),
    ('postgresql+psycopg2://u:p@db/ic', 'postgresql+psycopg2://u:p@db/ic'),
    ('sqlite:////var/lib/x.sqlite', 'sqlite:////var/lib/x.sqlite'),
])
def test_urls_without_driver_get_the_installed_one(given, expected):
    assert database.with_driver(given) == expected


def test_driverless_url_is_overridden_once_parsed(load):
    conf = load('[database]\nconnection = postgresql://u:pa$$ss@db/ic\n')
    database.use_installed_drivers(conf)
    url = make_url(conf.database.connection)
    assert (url.drivername, url.password) == ('postgresql+psycopg2', 'pa$ss')


def test_sqlite_directory(load, tmp_path):
    conf = load(f'[DEFAULT]\nstate_path = {tmp_path}/state\n')
    assert database.sqlite_directory(conf) == f'{tmp_path}/state'
    with pytest.raises(exception.InvalidConfig, match='db sync" creates it'):
        database.check_sqlite_directory(conf)
    conf = load('[database]\nconnection = sqlite://\n')
    assert database.sqlite_directory(conf) is None
    database.check_sqlite_directory(conf)
