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

"""The Ironic adapter against a real standalone Ironic (noauth, fake-hardware, page size 20)."""

import logging
import signal
import socket
import time
import uuid as uuidlib

import pytest
from oslo_config import cfg

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.conf import ironic as ironic_conf
from ironic_compute.harness import ironic as standalone
from tests.functional import ironic_env
from tests.functional.ironic_env import ironic_nodes  # noqa: F401 - fixture
from tests.functional.ironic_env import ironic_server  # noqa: F401 - fixture

pytestmark = pytest.mark.functional


@pytest.fixture
def make_adapter(ironic_server):  # noqa: F811
    """``make_adapter(url=None, **[ironic] overrides)`` -> an IronicClient (noauth)."""

    def make(url=None, **overrides):
        conf = cfg.ConfigOpts()
        ironic_conf.register_opts(conf)
        conf([], default_config_files=[], default_config_dirs=[])
        values = {'auth_type': 'none', 'endpoint_override': url or ironic_server.url,
                  'api_max_retries': 1, 'api_retry_interval': 0, 'timeout': 5}
        values.update(overrides)
        for name, value in values.items():
            conf.set_override(name, value, group='ironic')
        return ironic.IronicClient(conf)
    return make


def by_uuid(nodes):
    uuids = [n.uuid for n in nodes]
    assert len(uuids) == len(set(uuids)), 'a node was listed twice'
    return {n.uuid: n for n in nodes}


def release(client, uuids):
    """Maintenance on, so that cleanup deletes nodes with an instance at once (Ironic answers
    409 to deleting them otherwise, which the shared cleanup retries for 30 s per node)."""
    for uuid in uuids:
        client.node.set_maintenance(uuid, True, maint_reason='test cleanup')


def reference(client, **filters):
    """What Ironic lists, page by page with the filters on every page (ironic_env's helper;
    not ironicclient's limit=0, whose next links lose the filters)."""
    return {n['uuid'] for n in ironic_env.list_nodes(client, fields=['uuid'], **filters)}


def test_listing_is_exact_across_pages(ironic_server, ironic_nodes, make_adapter):  # noqa: F811
    for group in ('group-a', 'group-b'):
        if group not in ironic_server.groups:
            pytest.skip(f'this Ironic has no conductor for {group}')
    default = set(ironic_nodes.create(45, conductor_group=''))
    group_a = set(ironic_nodes.create(30, conductor_group='group-a', instance_uuids=True))
    group_b = set(ironic_nodes.create(3, conductor_group='group-b'))
    client = ironic_nodes.client
    try:
        check_listing(ironic_server, ironic_nodes, make_adapter(), default, group_a, group_b)
    finally:
        release(client, group_a)


def test_a_page_says_whether_more_may_follow(ironic_server, ironic_nodes):  # noqa: F811
    """Ironic's next link, which the listing ends on: given with every full
    page, not with a short one (so no empty page is asked for after it)."""
    size = ironic_server.page_size
    if not size:
        pytest.skip("this Ironic's page size is not known")
    client = ironic_nodes.client
    count = len(reference(client, conductor_group=''))
    wanted = max(count, size + 1)
    wanted += 1 if wanted % size == 0 else 0   # a short last page
    ironic_nodes.create(wanted - count, conductor_group='')
    pages, marker, more = [], None, True
    while more:
        page, more = ironic._one_page(client, fields=['uuid'], marker=marker,
                                      conductor_group='')
        pages.append((len(page), more))
        marker = page[-1].uuid
    assert pages == [(size, True)] * (wanted // size) + [(wanted % size, False)]


def check_listing(ironic_server, ironic_nodes, adapter, default, group_a, group_b):  # noqa: F811
    ours = default | group_a | group_b
    client = ironic_nodes.client

    everything = by_uuid(adapter.list_nodes())
    assert ours <= everything.keys()
    assert everything.keys() == reference(client)
    for uuids, group in ((default, ''), (group_a, 'group-a'), (group_b, 'group-b')):
        listed = by_uuid(adapter.list_nodes(conductor_group=group))
        assert listed.keys() & ours == uuids
        assert {n.conductor_group for n in listed.values()} == {group}
        assert listed.keys() == reference(client, conductor_group=group)
    if ironic_server.page_size:
        assert len(default) > 2 * ironic_server.page_size   # three pages at least

    node = everything[sorted(group_a)[0]]
    assert node.name.startswith(ironic_nodes.name_prefix)
    assert node.provision_state == 'enroll' and node.instance_uuid
    assert node.maintenance is False and node.shard is None
    assert node.properties['memory_mb'] == 65536 and node.resource_class == 'baremetal'
    assert adapter._client.current_api_version == '1.82'


def test_shard_filter(ironic_nodes, make_adapter):  # noqa: F811
    shard = f'ic-adapter-{uuidlib.uuid4().hex[:8]}'
    sharded = set(ironic_nodes.create(22, shard=shard))
    other = set(ironic_nodes.create(2, shard=shard + '-other'))
    unsharded = set(ironic_nodes.create(2))
    adapter = make_adapter()

    listed = by_uuid(adapter.list_nodes(shards=[shard]))
    assert listed.keys() == sharded
    assert {n.shard for n in listed.values()} == {shard}
    assert by_uuid(adapter.list_nodes(shards=[shard, shard + '-other'])).keys() == sharded | other
    assert by_uuid(adapter.list_nodes(conductor_group='', shards=[shard])).keys() == sharded
    assert adapter.list_nodes(conductor_group='group-a', shards=[shard]) == []

    counts = adapter.list_shards()
    assert counts[shard] == 22 and counts[shard + '-other'] == 2
    assert counts[ironic.UNSHARDED] >= 2
    plain = by_uuid(adapter.list_nodes(sharded=False))
    assert unsharded <= plain.keys() and not plain.keys() & (sharded | other)
    assert {n.shard for n in plain.values()} == {None}
    assert counts[ironic.UNSHARDED] == len(reference(ironic_nodes.client, sharded=False))
    fetched = adapter.get_nodes([*sorted(other), str(uuidlib.uuid4())])
    assert {n.uuid for n in fetched} == other
    assert {n.shard for n in fetched} == {shard + '-other'}


def test_node_exists(ironic_nodes, make_adapter):  # noqa: F811
    kept, deleted = ironic_nodes.create(2)
    ironic_env.delete_nodes(ironic_nodes.client, [deleted])
    adapter = make_adapter()
    assert adapter.node_exists(kept) is True
    assert adapter.node_exists(deleted) is False
    assert adapter.node_exists(str(uuidlib.uuid4())) is False


def test_resources_of_real_nodes(ironic_nodes, make_adapter, caplog):  # noqa: F811
    good = {'cpus': 16, 'memory_mb': 65536, 'local_gb': 480, 'cpu_arch': 'x86_64',
            'capabilities': 'boot_mode:uefi,secure_boot:true'}
    free, maintained, with_instance, enrolled = ironic_nodes.create(4, properties=good)
    # Ironic 39 refuses a bad memory_mb or local_gb, not a bad cpus or missing properties.
    (bad,) = ironic_nodes.create(1, properties={'cpus': 'many'})
    ironic_nodes.make_available([free, maintained, with_instance])
    client = ironic_nodes.client
    client.node.set_maintenance(maintained, True, maint_reason='test')
    client.node.update(with_instance, [
        {'op': 'add', 'path': '/instance_uuid', 'value': str(uuidlib.uuid4())}])
    caplog.set_level(logging.WARNING)
    try:
        nodes = by_uuid(make_adapter().list_nodes())
    finally:
        release(client, [with_instance])
    resources = {u: ironic.node_resources(nodes[u])
                 for u in (free, maintained, with_instance, enrolled, bad)}
    assert resources[free] == ironic.Resources(
        vcpus=16, memory_mb=65536, local_gb=480, vcpus_used=0, memory_mb_used=0,
        local_gb_used=0, cpu_arch='x86_64', resource_class='baremetal',
        capabilities={'boot_mode': 'uefi', 'secure_boot': 'true'}, available=True)
    for uuid in (maintained, with_instance, enrolled):
        res = resources[uuid]
        assert not res.available
        assert (res.vcpus_used, res.memory_mb_used, res.local_gb_used) == (16, 65536, 480)
    res = resources[bad]
    assert (res.vcpus, res.memory_mb, res.local_gb, res.available) == (0, 0, 0, False)
    messages = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    for field in ('cpus', 'memory_mb', 'local_gb'):
        assert any(field in m for m in messages), (field, messages)


def test_nothing_listening_is_unavailable(make_adapter):
    with socket.socket() as sock:   # a port that was free a moment ago: connection refused
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    adapter = make_adapter(f'http://127.0.0.1:{port}', api_max_retries=2)
    start = time.monotonic()
    with pytest.raises(exception.IronicUnavailable):
        adapter.list_nodes()
    with pytest.raises(exception.IronicUnavailable):
        adapter.node_exists(str(uuidlib.uuid4()))
    assert time.monotonic() - start < 5


def test_silent_server_times_out_instead_of_hanging(make_adapter):
    with socket.socket() as sock:   # accepts connections (backlog), never answers
        sock.bind(('127.0.0.1', 0))
        sock.listen(16)
        adapter = make_adapter(f'http://127.0.0.1:{sock.getsockname()[1]}', timeout=1)
        start = time.monotonic()
        with pytest.raises(exception.IronicUnavailable):
            adapter.list_nodes()
        elapsed = time.monotonic() - start
    assert 1.5 < elapsed < 6    # two tries (api_max_retries=1) of 1 s each


@pytest.fixture
def own_ironic(ironic_server, tmp_path):  # noqa: F811
    """A throwaway Ironic of this test's own, to crash without harming the
    session's server (a SIGKILLed conductor stays registered in SQLite)."""
    ironic_server.require_managed()  # installed and startable here
    server = standalone.IronicServer(
        state_dir=str(tmp_path / 'ironic'), port=0, groups=[''], max_limit=20,
        die_with_parent=True, log=lambda msg: None)
    server.start(install=False)
    yield server
    server.stop(quiet=True)


def test_ironic_stopped_and_back(own_ironic, make_adapter):
    client = ironic_env.make_client(own_ironic.url)
    (node,) = ironic_env.create_nodes(client, 1, name_prefix=None)
    adapter = make_adapter(own_ironic.url)
    assert node in by_uuid(adapter.list_nodes())
    own_ironic.stop_process('ironic', sig=signal.SIGKILL)   # a crash
    try:
        start = time.monotonic()
        with pytest.raises(exception.IronicUnavailable):
            adapter.list_nodes()
        with pytest.raises(exception.IronicUnavailable):
            adapter.node_exists(node)   # unknown, never "gone"
        assert time.monotonic() - start < 5
    finally:
        own_ironic.start_process('ironic')
    assert node in by_uuid(adapter.list_nodes())
    assert adapter.node_exists(node) is True
