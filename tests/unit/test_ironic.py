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

"""The Ironic adapter against a fake ironicclient at the module's boundary."""

import logging
import pathlib
import re
import socket
import threading
import time
import types

import pytest
from ironicclient import client as ironic_client
from ironicclient import exc as ironic_exc
from ironicclient.v1 import node as ironic_node
from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import session as ks_session
from oslo_config import cfg

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.conf import instances as instances_conf
from ironic_compute.conf import ironic as ironic_conf

FIELDS = ['uuid', 'name', 'conductor_group', 'shard', 'instance_uuid', 'provision_state',
          'power_state', 'maintenance', 'properties', 'resource_class', 'last_error',
          'traits']
SECRET = 's3cret-Pa55'


def raw_node(uuid, **fields):
    info = {'uuid': uuid, 'name': None, 'conductor_group': '', 'shard': None,
            'instance_uuid': None, 'provision_state': 'available',
            'power_state': 'power off', 'maintenance': False,
            'properties': {'cpus': 4, 'memory_mb': 1024, 'local_gb': 10},
            'resource_class': 'baremetal', 'last_error': None,
            'updated_at': '2026-11-22T10:00:00+00:00'}
    info.update(fields)
    return info


def make_node(**fields):
    info = raw_node(fields.pop('uuid', 'node-1'), **fields)
    return ironic.Node(**info)


class FakeNodes:
    """``client.node``: records calls; ``list`` returns the canned pages in turn (an
    Exception among them is raised), then empty pages."""

    def __init__(self, nodes=(), error=None, pages=None):
        self.nodes = [types.SimpleNamespace(**n) for n in nodes]
        self.pages = [[types.SimpleNamespace(**n) for n in page]
                      if isinstance(page, list) else page
                      for page in (pages if pages is not None else [nodes])]
        self.error = error
        self.get_errors = []   # raised by get() in turn, before ``error``
        self.calls = []

    def list(self, **kwargs):
        self.calls.append(('list', kwargs))
        if self.error:
            raise self.error
        page = self.pages.pop(0) if self.pages else []
        if isinstance(page, Exception):
            raise page
        return list(page)

    def get(self, uuid, **kwargs):
        self.calls.append(('get', uuid, kwargs))
        if self.get_errors:
            raise self.get_errors.pop(0)
        if self.error:
            raise self.error
        for node in self.nodes:
            if node.uuid == uuid:
                return node
        raise ironic_exc.NotFound(f'Node {uuid} could not be found.')


class FakeClient:
    def __init__(self, version='1.82', nodes=(), error=None, pages=None):
        self.current_api_version = version
        self.node = FakeNodes(nodes, error, pages)
        self.negotiations = []
        self.is_api_version_negotiated = False

    def negotiate_api_version(self):
        error = self.negotiations.pop(0) if self.negotiations else None
        if isinstance(error, OSError):
            self.is_api_version_negotiated = True
        if error:
            raise error
        self.is_api_version_negotiated = True
        return self.current_api_version


@pytest.fixture
def conf(tmp_path):
    def load(text='[ironic]\nauth_type = none\nendpoint_override = http://127.0.0.1:6385\n'):
        conf = cfg.ConfigOpts()
        ironic_conf.register_opts(conf)
        path = tmp_path / 'ironic-compute.conf'
        path.write_text(text)
        conf(['--config-file', str(path)], project='ironic-compute')
        conf.set_override('api_retry_interval', 0, group='ironic')
        return conf
    return load


@pytest.fixture
def get_client(monkeypatch):
    """Replace ironicclient's get_client; ``.calls`` holds its kwargs."""
    def fake(api_version, **kwargs):
        fake.calls.append((api_version, kwargs))
        if fake.errors:
            raise fake.errors.pop(0)
        return fake.client
    fake.calls = []
    fake.errors = []
    fake.client = FakeClient(nodes=[raw_node('n1')])
    monkeypatch.setattr(ironic_client, 'get_client', fake)
    return fake


@pytest.fixture
def sleeps(monkeypatch):
    """The waits between retries, recorded instead of waited."""
    calls = []
    monkeypatch.setattr(ironic, '_pause', lambda delay, stopping, error: calls.append(delay))
    return calls


def adapter(conf, **kwargs):
    return ironic.IronicClient(conf(), FakeClient(**kwargs))


# ----------------------------------------------------------------- listing


def list_call(marker=None, conductor_group=None, shards=None, fields=FIELDS):
    return ('list', {'fields': fields, 'marker': marker, 'conductor_group': conductor_group,
                     'shards': shards})


def test_list_without_filters(conf):
    client = adapter(conf, nodes=[raw_node('n1'), raw_node('n2', conductor_group='g')])
    nodes = client.list_nodes()
    assert [n.uuid for n in nodes] == ['n1', 'n2']
    assert nodes[1].conductor_group == 'g'
    assert client._client.node.calls == [list_call(), list_call('n2')]


def test_list_with_filters_sends_them_with_every_page(conf):
    client = adapter(conf, pages=[[raw_node('n1')], [raw_node('n2')], []])
    nodes = client.list_nodes(conductor_group='group-a', shards=['s1', 's2'])
    assert [n.uuid for n in nodes] == ['n1', 'n2']
    filters = {'conductor_group': 'group-a', 'shards': ['s1', 's2']}
    assert client._client.node.calls == [
        list_call(None, **filters), list_call('n1', **filters), list_call('n2', **filters)]


def test_no_nodes_is_an_empty_list(conf):
    client = adapter(conf, pages=[[]])
    assert client.list_nodes() == []
    assert client._client.node.calls == [list_call()]


def test_default_group_is_a_filter_not_no_filter(conf):
    client = adapter(conf)
    client.list_nodes(conductor_group='')
    assert client._client.node.calls[0][1]['conductor_group'] == ''


def test_list_converts_every_field(conf):
    raw = raw_node('n1', name='rack1-1', shard='s1', instance_uuid='i1',
                   provision_state='active', power_state='power on', maintenance=True,
                   last_error='boom')
    (node,) = adapter(conf, nodes=[raw]).list_nodes()
    assert node == ironic.Node(**raw)
    assert node.properties == raw['properties'] and node.properties is not raw['properties']


def test_list_returns_each_node_once(conf):
    # A node may show up on two pages when the order shifts under the marker.
    client = adapter(conf, pages=[[raw_node('n1'), raw_node('n2')],
                                  [raw_node('n2'), raw_node('n3')], []])
    assert [n.uuid for n in client.list_nodes()] == ['n1', 'n2', 'n3']


def test_listing_that_does_not_advance_is_unavailable(conf):
    page = [raw_node('n1'), raw_node('n2')]
    client = adapter(conf, pages=[page, page, page])
    with pytest.raises(exception.IronicUnavailable, match='does not advance'):
        client.list_nodes()


def test_failure_on_a_later_page_is_unavailable(conf):
    error = ironic_exc.NotFound('Node n1 could not be found.')   # marker node deleted
    client = adapter(conf, pages=[[raw_node('n1')], error])
    with pytest.raises(exception.IronicUnavailable) as exc:
        client.list_nodes()
    assert exc.value.__cause__ is error


def test_missing_or_odd_properties_become_empty(conf):
    client = adapter(conf, nodes=[raw_node('n1', properties=None, maintenance=None)])
    (node,) = client.list_nodes()
    assert node.properties == {} and node.maintenance is False


@pytest.mark.parametrize('error', [
    ks_exc.ConnectFailure('refused'),
    ks_exc.ConnectTimeout('slow'),
    ironic_exc.ServiceUnavailable(),
    ironic_exc.Conflict(),
    ironic_exc.InternalServerError(),
    ironic_exc.Unauthorized(),
    ironic_exc.ClientException('generic'),
    ValueError('bad JSON'),
])
def test_list_failure_is_unavailable(conf, error):
    client = adapter(conf, error=error)
    with pytest.raises(exception.IronicUnavailable) as exc:
        client.list_nodes()
    assert not isinstance(exc.value, exception.IronicConfigError)
    assert exc.value.__cause__ is error


class PagedAPI:
    """The HTTP side of ironicclient's real NodeManager: canned pages or errors."""

    endpoint_trimmed = 'http://ironic.test:6385'

    def __init__(self, *pages):
        self.pages = list(pages)
        self.urls = []

    def json_request(self, method, url, **kwargs):
        self.urls.append(url)
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return None, page


def paged_adapter(conf, api):
    client = types.SimpleNamespace(current_api_version='1.82',
                                   node=ironic_node.NodeManager(api))
    return ironic.IronicClient(conf(), client)


def test_real_node_manager_pages_with_filters_and_marker(conf):
    # Ironic's next links drop conductor_group/shard: they must not be followed.
    nxt = 'http://ironic.test:6385/v1/nodes?fields=uuid&limit=2&marker=n2'
    api = PagedAPI({'nodes': [raw_node('n1'), raw_node('n2')], 'next': nxt},
                   {'nodes': [raw_node('n3')]})
    nodes = paged_adapter(conf, api).list_nodes(conductor_group='g', shards=['s'])
    assert [n.uuid for n in nodes] == ['n1', 'n2', 'n3']
    # The second page has no next link: the last, no empty page asked for.
    assert len(api.urls) == 2
    for url, marker in zip(api.urls, (None, 'n2'), strict=True):
        assert url.startswith('/v1/nodes/?')
        params = url.split('?', 1)[1].split('&')
        assert 'fields=' + ','.join(FIELDS) in params
        assert 'conductor_group=g' in params and 'shard=s' in params
        assert 'limit=0' not in params
        assert (f'marker={marker}' in params) if marker else not any(
            p.startswith('marker=') for p in params)


def test_a_full_page_with_a_next_link_is_followed_by_the_next_page(conf):
    """Ironic gives a next link with every full page, even the last one."""
    nxt = 'http://ironic.test:6385/v1/nodes?limit=1&marker=n1'
    api = PagedAPI({'nodes': [raw_node('n1')], 'next': nxt},
                   {'nodes': [raw_node('n2')], 'next': nxt}, {'nodes': []})
    nodes = paged_adapter(conf, api).list_nodes(conductor_group='g')
    assert [n.uuid for n in nodes] == ['n1', 'n2']
    assert len(api.urls) == 3


def test_without_ironicclients_manager_pages_are_read_until_an_empty_one(conf):
    """Whether an answer had a next link cannot be seen: a short page is
    not taken for the last."""
    client = adapter(conf, pages=[[raw_node('n1')], [raw_node('n2')]])
    assert [n.uuid for n in client.list_nodes()] == ['n1', 'n2']
    assert len(client._client.node.calls) == 3


def test_real_node_manager_failure_on_a_later_page(conf, sleeps):
    # The failing page is retried (api_max_retries = 3) with the same marker, then given up.
    nxt = 'http://ironic.test:6385/v1/nodes?limit=1&marker=n1'
    errors = [ironic_exc.ServiceUnavailable() for _ in range(4)]
    api = PagedAPI({'nodes': [raw_node('n1')], 'next': nxt}, *errors, {'nodes': []})
    with pytest.raises(exception.IronicUnavailable) as exc:
        paged_adapter(conf, api).list_nodes()
    assert exc.value.__cause__ is errors[-1]
    assert len(api.urls) == 5 and len(sleeps) == 3
    assert all('marker=n1' in url.split('?', 1)[1].split('&') for url in api.urls[1:])


# ----------------------------------------------------------------- API versions


def test_partition_key_with_old_api_is_a_config_error(conf):
    client = adapter(conf, version='1.45')
    with pytest.raises(exception.IronicConfigError, match='older than 1.46'):
        client.list_nodes(conductor_group='group-a')
    assert client._client.node.calls == []


def test_old_api_without_filters_asks_only_known_fields(conf):
    client = adapter(conf, version='1.45', nodes=[raw_node('n1')])
    (node,) = client.list_nodes()
    fields = client._client.node.calls[0][1]['fields']
    assert 'conductor_group' not in fields and 'shard' not in fields
    assert 'resource_class' in fields


def test_group_without_shard_support(conf):
    client = adapter(conf, version='1.46')
    client.list_nodes(conductor_group='g')
    assert client._client.node.calls[0][1]['fields'] == [f for f in FIELDS if f != 'shard']


def test_shard_with_old_api_is_a_config_error(conf):
    client = adapter(conf, version='1.81')
    with pytest.raises(exception.IronicConfigError, match='older than 1.82'):
        client.list_nodes(shards=['s1'])


def test_empty_shard_list_is_a_config_error(conf):
    with pytest.raises(exception.IronicConfigError):
        adapter(conf).list_nodes(shards=[])


def test_config_error_is_also_unavailable():
    assert issubclass(exception.IronicConfigError, exception.IronicUnavailable)


def test_unsupported_version_renegotiates_next_time(conf, get_client):
    client = ironic.IronicClient(conf(), FakeClient(error=ironic_exc.UnsupportedVersion()))
    with pytest.raises(exception.IronicUnavailable):
        client.list_nodes()
    assert [n.uuid for n in client.list_nodes()] == ['n1']
    assert len(get_client.calls) == 1


# ----------------------------------------------------------------- node_exists


def test_node_exists(conf):
    client = adapter(conf, nodes=[raw_node('n1')])
    assert client.node_exists('n1') is True
    assert client._client.node.calls == [('get', 'n1', {'fields': ['uuid']})]


def test_node_gone_only_on_404(conf):
    assert adapter(conf).node_exists('n1') is False


@pytest.mark.parametrize('error', [
    ironic_exc.InternalServerError(), ironic_exc.ServiceUnavailable(),
    ks_exc.ConnectFailure('refused'), ironic_exc.Forbidden(), ironic_exc.BadRequest()])
def test_node_exists_unknown_is_unavailable(conf, error):
    with pytest.raises(exception.IronicUnavailable):
        adapter(conf, error=error).node_exists('n1')


# ----------------------------------------------------------------- building the client


def test_noauth_with_endpoint_override(conf, get_client):
    config = conf('[ironic]\nauth_type = none\nendpoint_override = http://127.0.0.1:6385\n'
                  'timeout = 7\napi_max_retries = 4\nregion_name = r1\n')
    client = ironic.IronicClient(config)
    client.list_nodes()
    ((version, kwargs),) = get_client.calls
    assert version == '1'
    session = kwargs.pop('session')
    assert session.timeout == 7
    assert type(session.auth).__name__ == 'NoAuth'
    assert kwargs == {
        'endpoint': 'http://127.0.0.1:6385',
        'os_ironic_api_version': ['1.21', '1.38', '1.46', '1.52', '1.56', '1.65', '1.82'],
        'max_retries': 0, 'retry_interval': 0, 'service_type': 'baremetal',
        'region_name': 'r1', 'valid_interfaces': ['internal', 'public']}


PASSWORD_CONF = f"""[ironic]
auth_type = password
auth_url = http://keystone.test:5000/v3
username = ironic-compute
password = {SECRET}
project_name = service
user_domain_name = Default
project_domain_name = Default
region_name = RegionTwo
valid_interfaces = internal
"""


def test_the_connection_pool_holds_a_connection_per_build_worker(conf, get_client):
    config = conf()
    client = ironic.IronicClient(config)
    client.list_nodes()
    adapters = get_client.calls[0][1]['session'].session.adapters
    # Only the [ironic] options here: requests' default size.
    assert {a._pool_maxsize for a in adapters.values()} == {ironic.POOL_SIZE}

    config.register_opts(instances_conf.opts)
    config.set_override('max_concurrent_builds', 30)
    get_client.calls.clear()
    ironic.IronicClient(config).list_nodes()
    adapters = get_client.calls[0][1]['session'].session.adapters
    assert set(adapters) == {'http://', 'https://'}
    assert {a._pool_maxsize for a in adapters.values()} == {32}
    assert all(isinstance(a, ks_session.TCPKeepAliveAdapter) for a in adapters.values())


def test_password_auth_uses_the_catalog(conf, get_client, caplog):
    caplog.set_level(logging.DEBUG)
    client = ironic.IronicClient(conf(PASSWORD_CONF))
    client.list_nodes()
    ((_version, kwargs),) = get_client.calls
    auth = kwargs['session'].auth
    assert type(auth).__name__ == 'Password'
    assert auth.auth_url == 'http://keystone.test:5000/v3'
    assert 'endpoint' not in kwargs
    assert kwargs['region_name'] == 'RegionTwo'
    assert kwargs['valid_interfaces'] == ['internal']
    assert kwargs['service_type'] == 'baremetal'
    assert 'auth_type password' in caplog.text and 'RegionTwo' in caplog.text
    assert SECRET not in caplog.text


def test_password_auth_with_endpoint_override(conf, get_client):
    client = ironic.IronicClient(conf(PASSWORD_CONF + 'endpoint_override = https://bm:6385\n'))
    client.list_nodes()
    assert get_client.calls[0][1]['endpoint'] == 'https://bm:6385'


def test_no_secret_in_logs_or_errors(conf, get_client, caplog):
    caplog.set_level(logging.DEBUG)
    get_client.errors = [ironic_exc.AmbiguousAuthSystem('no endpoint')]
    client = ironic.IronicClient(conf(PASSWORD_CONF))
    with pytest.raises(exception.IronicUnavailable) as exc:
        client.list_nodes()
    assert SECRET not in str(exc.value)
    client.list_nodes()
    assert SECRET not in caplog.text


def test_auth_type_unset_is_a_config_error(conf, get_client):
    client = ironic.IronicClient(conf('[ironic]\nendpoint_override = http://127.0.0.1:6385\n'))
    with pytest.raises(exception.IronicConfigError, match='auth_type'):
        client.list_nodes()
    assert get_client.calls == []


def test_incomplete_password_auth_is_a_config_error(conf, get_client):
    client = ironic.IronicClient(conf('[ironic]\nauth_type = password\n'))
    with pytest.raises(exception.IronicConfigError, match='auth_url'):
        client.list_nodes()


def test_client_is_built_once(conf, get_client):
    client = ironic.IronicClient(conf())
    client.list_nodes()
    client.node_exists('n1')
    client.list_nodes()
    assert len(get_client.calls) == 1


def test_client_is_rebuilt_after_a_failed_build(conf, get_client):
    get_client.errors = [ironic_exc.AmbiguousAuthSystem('catalog down')]
    client = ironic.IronicClient(conf())
    with pytest.raises(exception.IronicUnavailable, match='catalog down'):
        client.node_exists('n1')
    assert client.node_exists('n1') is True
    assert len(get_client.calls) == 2


def test_negotiation_retries_are_bounded(conf, get_client, sleeps, longest_waits):
    config = conf()
    config.set_override('api_max_retries', 2, group='ironic')
    config.set_override('api_retry_interval', 3, group='ironic')
    get_client.client.negotiations = [ks_exc.ConnectFailure('refused')] * 4
    with pytest.raises(exception.IronicUnavailable, match='refused'):
        ironic.IronicClient(config).list_nodes()
    assert sleeps == [3, 6]
    assert len(get_client.client.negotiations) == 1   # 3 attempts, not 4


def test_negotiation_recovers_within_retries(conf, get_client, sleeps):
    get_client.client.negotiations = [ironic_exc.ServiceUnavailable()]
    assert len(ironic.IronicClient(conf()).list_nodes()) == 1
    assert sleeps == [0]


def test_negotiation_does_not_retry_other_errors(conf, get_client, sleeps):
    get_client.client.negotiations = [ironic_exc.UnsupportedVersion('too old')]
    with pytest.raises(exception.IronicUnavailable, match='too old'):
        ironic.IronicClient(conf()).list_nodes()
    assert sleeps == []


def test_unwritable_version_cache_is_not_fatal(conf, get_client, caplog):
    get_client.client.negotiations = [PermissionError('read-only home')]
    assert len(ironic.IronicClient(conf()).list_nodes()) == 1
    assert 'XDG_CACHE_HOME' in caplog.text


# ----------------------------------------------------------------- retries


@pytest.fixture
def longest_waits(monkeypatch):
    """The jitter always picks the longest wait it may."""
    monkeypatch.setattr(ironic.random, 'uniform', lambda low, high: high)


def retry_conf(conf, retries=3, interval=2):
    config = conf()
    config.set_override('api_max_retries', retries, group='ironic')
    config.set_override('api_retry_interval', interval, group='ironic')
    return config


def test_backoff_doubles_up_to_the_cap_with_jitter_bounds(monkeypatch):
    monkeypatch.setattr(ironic.random, 'uniform', lambda low, high: (low, high))
    assert [ironic._backoff(2, retry) for retry in range(1, 8)] == [
        (1, 2), (2, 4), (4, 8), (8, 16), (8, 16), (8, 16), (8, 16)]
    assert ironic._backoff(0, 5) == (0, 0)


def test_backoff_jitter_is_random_within_bounds():
    waits = [ironic._backoff(2, 3) for _ in range(200)]
    assert all(4 <= wait <= 8 for wait in waits)
    assert len(set(waits)) > 100            # not one fixed value
    assert min(waits) < 5 and max(waits) > 7
    assert all(8 <= ironic._backoff(2, 40) <= 16 for _ in range(50))


def test_waits_grow_and_are_capped(conf, sleeps, longest_waits):
    client = ironic.IronicClient(retry_conf(conf, retries=6),
                                 FakeClient(error=ironic_exc.ServiceUnavailable()))
    with pytest.raises(exception.IronicUnavailable):
        client.node_exists('n1')
    assert sleeps == [2, 4, 8, 16, 16, 16]
    assert len(client._client.node.calls) == 7


def test_waits_are_jittered_within_bounds(conf, sleeps):
    client = ironic.IronicClient(retry_conf(conf, retries=5),
                                 FakeClient(error=ks_exc.ConnectFailure('refused')))
    with pytest.raises(exception.IronicUnavailable):
        client.list_nodes()
    assert len(sleeps) == 5
    for wait, nominal in zip(sleeps, (2, 4, 8, 16, 16), strict=True):
        assert nominal / 2 <= wait <= nominal


@pytest.mark.parametrize('error', [
    ironic_exc.Conflict(), ironic_exc.ServiceUnavailable(),
    ironic_exc.ConnectionRefused('refused'), ks_exc.ConnectFailure('refused'),
    ks_exc.ConnectTimeout('timed out')])
@pytest.mark.parametrize('call', ['list_nodes', 'node_exists'])
def test_retriable_errors_are_tried_max_retries_plus_one_times(conf, sleeps, error, call):
    client = ironic.IronicClient(retry_conf(conf), FakeClient(error=error))
    with pytest.raises(exception.IronicUnavailable) as exc:
        getattr(client, call)(*(['n1'] if call == 'node_exists' else []))
    assert exc.value.__cause__ is error
    assert len(client._client.node.calls) == 4
    assert len(sleeps) == 3


@pytest.mark.parametrize('error', [
    ironic_exc.BadRequest(), ironic_exc.NotFound(), ironic_exc.NotAcceptable(),
    ironic_exc.Unauthorized(), ironic_exc.InternalServerError(),
    ks_exc.SSLError('bad certificate'), ValueError('bad JSON')])
def test_other_errors_are_not_retried(conf, sleeps, error):
    client = ironic.IronicClient(retry_conf(conf), FakeClient(error=error))
    with pytest.raises(exception.IronicUnavailable) as exc:
        client.list_nodes()
    assert exc.value.__cause__ is error
    assert len(client._client.node.calls) == 1
    assert sleeps == []


def test_node_exists_404_and_400_are_not_retried(conf, sleeps):
    client = ironic.IronicClient(retry_conf(conf), FakeClient())
    assert client.node_exists('n1') is False
    client._client.node.get_errors = [ironic_exc.BadRequest()]
    with pytest.raises(exception.IronicUnavailable):
        client.node_exists('n1')
    assert len(client._client.node.calls) == 2
    assert sleeps == []


def test_zero_retries_means_one_attempt(conf, sleeps):
    client = ironic.IronicClient(retry_conf(conf, retries=0),
                                 FakeClient(error=ironic_exc.Conflict()))
    with pytest.raises(exception.IronicUnavailable):
        client.list_nodes()
    assert len(client._client.node.calls) == 1
    assert sleeps == []


def test_list_succeeds_after_failures(conf, sleeps, longest_waits):
    client = ironic.IronicClient(retry_conf(conf), FakeClient(pages=[
        [raw_node('n1')], ironic_exc.ServiceUnavailable(), ironic_exc.Conflict(),
        ks_exc.ConnectTimeout('slow'), [raw_node('n2')], []]))
    assert [n.uuid for n in client.list_nodes()] == ['n1', 'n2']
    assert client._client.node.calls == [list_call(), *[list_call('n1')] * 4, list_call('n2')]
    assert sleeps == [2, 4, 8]     # retries counted per request: the 3rd is the last


def test_retries_are_counted_per_request(conf, sleeps, longest_waits):
    client = ironic.IronicClient(retry_conf(conf), FakeClient(pages=[
        ironic_exc.Conflict(), [raw_node('n1')], ironic_exc.Conflict(), []]))
    assert [n.uuid for n in client.list_nodes()] == ['n1']
    assert sleeps == [2, 2]


def test_node_exists_succeeds_after_failures(conf, sleeps):
    client = ironic.IronicClient(retry_conf(conf), FakeClient(nodes=[raw_node('n1')]))
    client._client.node.get_errors = [ironic_exc.Conflict(), ks_exc.ConnectFailure('x')]
    assert client.node_exists('n1') is True
    assert len(client._client.node.calls) == 3 and len(sleeps) == 2


def test_ironicclient_does_not_retry_on_its_own(conf, sleeps, monkeypatch):
    # The real ironicclient, its HTTP session failing: each of our 4 attempts must be one
    # request (ironicclient's own retries would make 4 × 4, and sleep in between).
    requests = []

    def refuse(self, url, method, **kwargs):
        requests.append((method, url))
        raise ks_exc.ConnectFailure('refused')

    monkeypatch.setattr(ks_session.Session, 'request', refuse)
    monkeypatch.setattr(ironic.IronicClient, '_negotiate', lambda self, client: None)
    client = ironic.IronicClient(retry_conf(conf))
    with pytest.raises(exception.IronicUnavailable, match='refused'):
        client.node_exists('n1')
    assert client._client.http_client.conflict_max_retries == 0
    assert len(requests) == 4
    assert len(sleeps) == 3


# ----------------------------------------------------------------- node_resources


def test_resources_of_a_free_node():
    node = make_node(properties={'cpus': '8', 'memory_mb': 4096, 'local_gb': 100,
                                 'cpu_arch': 'x86_64', 'capabilities': 'boot_mode:uefi'})
    assert ironic.node_resources(node) == ironic.Resources(
        vcpus=8, memory_mb=4096, local_gb=100, vcpus_used=0, memory_mb_used=0,
        local_gb_used=0, cpu_arch='x86_64', resource_class='baremetal',
        capabilities={'boot_mode': 'uefi'}, available=True)


@pytest.mark.parametrize('fields, free', [
    ({}, True),
    ({'maintenance': True}, False),
    ({'instance_uuid': 'i1'}, False),
    ({'power_state': None}, True),
    ({'power_state': 'error'}, False),
    ({'power_state': 'power on'}, True),
    ({'provision_state': 'active', 'instance_uuid': 'i1'}, False),
    ({'provision_state': 'active'}, False),
    ({'provision_state': 'deploy failed'}, False),
    ({'provision_state': 'clean failed'}, False),
    ({'provision_state': 'error'}, False),
    ({'provision_state': 'cleaning'}, False),
    ({'provision_state': 'deploying', 'instance_uuid': 'i1'}, False),
    ({'provision_state': 'manageable'}, False),
    ({'provision_state': 'enroll', 'power_state': None}, False),
    ({'provision_state': None}, False),
])
def test_state_table(fields, free):
    res = ironic.node_resources(make_node(**fields))
    assert res.available is free
    assert (res.vcpus, res.memory_mb, res.local_gb) == (4, 1024, 10)
    used = (res.vcpus_used, res.memory_mb_used, res.local_gb_used)
    assert used == ((0, 0, 0) if free else (4, 1024, 10))


@pytest.mark.parametrize('value, expected, warns', [
    (4, 4, False), ('4', 4, False), (4.0, 4, False), ('4.0', 4, False), (' 4 ', 4, False),
    (0, 0, False),
    ('2.5', 2, True), (2.5, 2, True),
    (None, 0, True), ('', 0, True), ('four', 0, True), (-1, 0, True), ('-3', 0, True),
    ('nan', 0, True), ('inf', 0, True), ('1e400', 0, True), (True, 0, True),
    ([4], 0, True), ({'n': 4}, 0, True),
])
def test_bad_properties_give_zero_and_a_warning(caplog, value, expected, warns):
    props = {'cpus': 4, 'memory_mb': value, 'local_gb': 10}
    res = ironic.node_resources(make_node(uuid='node-bad', properties=props))
    assert (res.vcpus, res.memory_mb, res.local_gb) == (4, expected, 10)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    if warns:
        (record,) = warnings
        assert 'node-bad' in record.getMessage() and 'memory_mb' in record.getMessage()
    else:
        assert warnings == []


def test_missing_properties_warn_once_per_field(caplog):
    res = ironic.node_resources(make_node(uuid='node-empty', properties={}))
    assert (res.vcpus, res.memory_mb, res.local_gb, res.cpu_arch) == (0, 0, 0, None)
    assert res.capabilities == {}
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 3
    for field, message in zip(('cpus', 'memory_mb', 'local_gb'), messages, strict=True):
        assert 'node-empty' in message and field in message


def test_used_node_with_bad_properties():
    res = ironic.node_resources(make_node(instance_uuid='i1', properties={'cpus': 'x'}))
    assert (res.vcpus, res.vcpus_used, res.memory_mb_used, res.available) == (0, 0, 0, False)


@pytest.mark.parametrize('raw, expected', [
    ('boot_mode:uefi,secure_boot:true', {'boot_mode': 'uefi', 'secure_boot': 'true'}),
    (' a : 1 , b:2 ,', {'a': '1', 'b': '2'}),
    ('url:http://x:80', {'url': 'http://x:80'}),
    ('a:', {'a': ''}),
    ({'boot_mode': 'bios', 'n': 2}, {'boot_mode': 'bios', 'n': '2'}),
    ('', {}),
    (None, {}),
])
def test_capabilities(raw, expected):
    res = ironic.node_resources(make_node(properties={'capabilities': raw}))
    assert res.capabilities == expected


@pytest.mark.parametrize('raw', ['novalue,a:1', ':x,a:1', 42, ['a:1']])
def test_bad_capabilities_are_skipped_with_a_warning(caplog, raw):
    res = ironic.node_resources(make_node(uuid='node-cap', properties={
        'cpus': 1, 'memory_mb': 1, 'local_gb': 1, 'capabilities': raw}))
    assert res.capabilities == ({'a': '1'} if isinstance(raw, str) else {})
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert 'node-cap' in record.getMessage()


@pytest.mark.parametrize('arch, expected', [('aarch64', 'aarch64'), ('', None), (7, None)])
def test_cpu_arch(arch, expected):
    assert ironic.node_resources(make_node(properties={'cpu_arch': arch})).cpu_arch == expected


def test_values_the_database_cannot_hold_are_refused(caplog):
    node = ironic.Node(uuid='n-big', name=None, conductor_group='', shard=None,
                       instance_uuid=None, provision_state='available',
                       power_state='power off', maintenance=False,
                       properties={'cpus': 2**40, 'memory_mb': 1024, 'local_gb': 1,
                                   'cpu_arch': 'x' * 40},
                       resource_class='baremetal', last_error=None, updated_at=None)
    resources = ironic.node_resources(node)
    assert resources.vcpus == 0 and resources.memory_mb == 1024
    assert resources.cpu_arch is None
    assert 'n-big' in caplog.text and 'cpu_arch' in caplog.text and 'cpus' in caplog.text


# ----------------------------------------------------------------- shards


class FakeShards:
    def __init__(self, shards=(), error=None):
        self.shards = [types.SimpleNamespace(**s) for s in shards]
        self.error = error
        self.calls = 0

    def list(self):
        self.calls += 1
        if self.error:
            raise self.error
        return list(self.shards)


def shard_adapter(conf, shards=(), error=None, version='1.82'):
    client = FakeClient(version=version)
    client.shard = FakeShards(shards, error)
    return ironic.IronicClient(conf(), client)


def test_list_shards_counts_by_name_with_the_unsharded_as_none(conf):
    client = shard_adapter(conf, [{'name': 'ic-01', 'count': 7},
                                  {'name': 'None', 'count': 3}])
    assert client.list_shards() == {'ic-01': 7, ironic.UNSHARDED: 3}
    assert ironic.UNSHARDED == 'None'


def test_list_shards_with_old_api_is_a_config_error(conf):
    client = shard_adapter(conf, version='1.81')
    with pytest.raises(exception.IronicConfigError, match='older than 1.82'):
        client.list_shards()
    assert client._client.shard.calls == 0


def test_list_shards_is_retried_then_unavailable(conf, sleeps):
    error = ironic_exc.ServiceUnavailable()
    client = shard_adapter(conf, error=error)
    with pytest.raises(exception.IronicUnavailable) as exc:
        client.list_shards()
    assert exc.value.__cause__ is error
    assert client._client.shard.calls == 4 and len(sleeps) == 3


def test_list_shards_bad_answer_is_unavailable(conf):
    client = shard_adapter(conf, [{'name': 'ic-01', 'count': None}])
    with pytest.raises(exception.IronicUnavailable):
        client.list_shards()


def test_unsharded_filter_is_sent_with_every_page(conf):
    client = adapter(conf, pages=[[raw_node('n1')], []])
    assert [n.uuid for n in client.list_nodes(conductor_group='g', sharded=False)] == ['n1']
    assert [call[1]['sharded'] for call in client._client.node.calls] == [False, False]
    assert all(call[1]['conductor_group'] == 'g' for call in client._client.node.calls)


def test_unsharded_filter_with_old_api_is_a_config_error(conf):
    with pytest.raises(exception.IronicConfigError, match='older than 1.82'):
        adapter(conf, version='1.81').list_nodes(sharded=False)


def test_get_nodes_fetches_each_and_leaves_out_the_gone(conf):
    client = adapter(conf, nodes=[raw_node('n1', shard='s1'), raw_node('n2')])
    nodes = client.get_nodes(['n1', 'gone', 'n2', 'n1'])
    assert [(n.uuid, n.shard) for n in nodes] == [('n1', 's1'), ('n2', None)]
    assert client._client.node.calls == [('get', u, {'fields': FIELDS})
                                         for u in ('n1', 'gone', 'n2')]


def test_get_nodes_failure_is_unavailable_not_partial(conf, sleeps):
    client = adapter(conf, nodes=[raw_node('n1')])
    client._client.node.get_errors = [ironic_exc.InternalServerError()]
    with pytest.raises(exception.IronicUnavailable, match='n1'):
        client.get_nodes(['n1'])


# ----------------------------------------------------------------- stopping


def in_thread(func, *args):
    """Run ``func`` in a thread; the thread and a dict that gets its error and the
    seconds it took."""
    outcome = {}

    def run():
        start = time.monotonic()
        try:
            func(*args)
        except Exception as e:
            outcome['error'] = e
        outcome['seconds'] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_stop_wakes_the_wait_between_retries(conf):
    # A wait of 30 s or more before the first retry, ended by the stop.
    client = ironic.IronicClient(retry_conf(conf, interval=60),
                                 FakeClient(nodes=[raw_node('n1')]))
    client._client.node.error = ks_exc.ConnectFailure('refused')
    thread, outcome = in_thread(client.node_exists, 'n1')
    time.sleep(0.3)
    assert thread.is_alive()  # waiting to retry
    client.stopping.set()
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(outcome['error'], exception.IronicUnavailable)
    assert 'the service is stopping' in str(outcome['error'])
    assert len(client._client.node.calls) == 1  # no retry after the stop


def test_no_retry_once_stopping(conf):
    client = ironic.IronicClient(retry_conf(conf, interval=0),
                                 FakeClient(nodes=[raw_node('n1')]))
    client._client.node.error = ironic_exc.ServiceUnavailable()
    client.stopping.set()
    with pytest.raises(exception.IronicUnavailable, match='the service is stopping'):
        client.list_nodes()
    assert len(client._client.node.calls) == 1


def test_stopping_lets_a_first_attempt_through(conf):
    # The cycle that runs when the stop comes still gets its answer.
    client = adapter(conf, nodes=[raw_node('n1')])
    client.stopping.set()
    assert [n.uuid for n in client.list_nodes()] == ['n1']


@pytest.fixture
def silent_ironic():
    """A TCP endpoint that accepts connections and never answers."""
    listener = socket.create_server(('127.0.0.1', 0))
    held = []
    halt = threading.Event()

    def accept():
        while not halt.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield f'http://127.0.0.1:{listener.getsockname()[1]}'
    halt.set()
    listener.close()
    for conn in held:
        conn.close()


def test_a_silent_ironic_is_unavailable_after_the_timeout(conf, silent_ironic, tmp_path,
                                                          monkeypatch):
    # The real ironicclient and keystoneauth session: [ironic]timeout bounds each
    # request, so a worker or a cycle never waits on such an Ironic for ever.
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    config = conf(f'[ironic]\nauth_type = none\nendpoint_override = {silent_ironic}\n'
                  'timeout = 1\napi_max_retries = 0\n')
    thread, outcome = in_thread(ironic.IronicClient(config).list_nodes)
    thread.join(15)
    assert not thread.is_alive()
    assert isinstance(outcome['error'], exception.IronicUnavailable)
    assert outcome['seconds'] < 10


# ----------------------------------------------------------- provisioning


@pytest.mark.parametrize('error, raised', [
    (ironic_exc.NotFound('Node n9 could not be found.'), exception.IronicNotFound),
    (ironic_exc.BadRequest('the BMC says no'), exception.IronicRefused),
    (ironic_exc.NotAcceptable('no such version'), exception.IronicRefused),
    (ironic_exc.Conflict('node n1 is locked'), exception.IronicRefused),  # past the retries
    (ironic_exc.InternalServerError('boom'), exception.IronicUnavailable),
    (ks_exc.ConnectFailure('refused'), exception.IronicUnavailable),
    (ValueError('bad JSON'), exception.IronicUnavailable),
])
def test_a_provisioning_request_raises_the_adapters_errors(conf, sleeps, error, raised):
    client = adapter(conf, nodes=[raw_node('n1')], error=error)
    with pytest.raises(raised) as exc:
        client.request('node.get', 'n1', fields=['uuid'])
    assert exc.value.__cause__ is error
    assert str(exc.value) == str(error)
    if raised is not exception.IronicUnavailable:
        assert not isinstance(exc.value, exception.IronicUnavailable)


def test_a_provisioning_request_names_the_clients_method(conf):
    client = adapter(conf, nodes=[raw_node('n1')])
    assert client.request('node.get', 'n1', fields=['uuid']).uuid == 'n1'
    assert client._client.node.calls == [('get', 'n1', {'fields': ['uuid']})]


def test_a_requests_check_runs_right_before_every_attempt(conf, sleeps):
    """The fence of a call that changes something: before the first attempt
    and before each retry (a 409 while Ironic holds the node's lock)."""
    client = ironic.IronicClient(retry_conf(conf), FakeClient(nodes=[raw_node('n1')]))
    client._client.node.get_errors = [ironic_exc.Conflict('locked'),
                                      ironic_exc.ServiceUnavailable()]
    checks = []

    def before():
        checks.append(len(client._client.node.calls))
    assert client.request('node.get', 'n1', before=before).uuid == 'n1'
    # Each check came before its attempt: none sent, one, two.
    assert checks == [0, 1, 2] and len(sleeps) == 2


def test_a_check_that_refuses_ends_the_request_unsent_as_it_is(conf, sleeps):
    client = ironic.IronicClient(retry_conf(conf), FakeClient(nodes=[raw_node('n1')]))
    client._client.node.get_errors = [ironic_exc.Conflict('locked')]
    refusal = exception.NotSent('another service manages it now')
    checks = []

    def before():
        checks.append(1)
        if len(checks) == 2:  # the retry's check: fenced meanwhile
            raise refusal
    with pytest.raises(exception.NotSent) as exc:
        client.request('node.get', 'n1', before=before)
    assert exc.value is refusal
    assert len(client._client.node.calls) == 1  # the retry was not sent


def test_only_the_adapter_imports_ironicclient():
    # The boundary: the service's other modules know this module's errors,
    # never ironicclient's (the harness is not the service).
    package = pathlib.Path(ironic.__file__).parent
    importers = sorted(
        str(path.relative_to(package)) for path in package.rglob('*.py')
        if 'harness' not in path.parts
        and re.search(r'^\s*(from|import) ironicclient', path.read_text(), re.M))
    assert importers == ['ironic.py']
