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

"""The standalone-Ironic fixture works: server up, nodes in groups, filtered paginated lists."""

import signal

import pytest
from ironicclient import exc as ironic_exc
from keystoneauth1 import exceptions as ksa_exc

from tests.functional.ironic_env import SESSION_GROUPS
from tests.functional.ironic_env import ironic_client  # noqa: F401 - fixture
from tests.functional.ironic_env import ironic_nodes  # noqa: F401 - fixture
from tests.functional.ironic_env import ironic_server  # noqa: F401 - fixture
from tests.functional.ironic_env import list_nodes

pytestmark = pytest.mark.functional

FIELDS = ["uuid", "name", "conductor_group", "provision_state", "instance_uuid", "properties"]


def test_server_answers_with_every_group(ironic_server, ironic_nodes):  # noqa: F811
    # Ironic refuses (HTTP 400) a node whose conductor group no conductor
    # serves: creating one in each group proves every group is served. (The
    # conductors' "alive" flag is not used: on SQLite it lags under load.)
    expected = SESSION_GROUPS if ironic_server.managed else ("",)
    for group in expected:
        (uuid,) = ironic_nodes.create(1, conductor_group=group)
        node = ironic_nodes.client.node.get(uuid, fields=["conductor_group"])
        assert node.conductor_group == group
    if ironic_server.managed:
        assert ironic_server.url.startswith("http://127.0.0.1:")
        assert all(ironic_server.server.pids.values()), ironic_server.server.pids


def test_list_filters_by_group_and_follows_pages(ironic_server, ironic_nodes):  # noqa: F811
    if "group-a" not in ironic_server.groups:
        pytest.skip("this Ironic has no conductor for group-a")
    client = ironic_nodes.client
    in_a = ironic_nodes.create(25, conductor_group="group-a", instance_uuids=lambda i: (
        None if i % 2 else f"00000000-0000-4000-8000-{i:012d}"))
    in_default = ironic_nodes.create(20, conductor_group="")
    mine = set(in_a) | set(in_default)

    listed = list_nodes(client, fields=FIELDS, conductor_group="group-a")
    assert {n["conductor_group"] for n in listed} == {"group-a"}
    ours = {n["uuid"]: n for n in listed if n["uuid"] in mine}
    assert sorted(ours) == sorted(in_a)
    assert ours[in_a[0]]["instance_uuid"] == "00000000-0000-4000-8000-000000000000"
    assert ours[in_a[1]]["instance_uuid"] is None
    assert ours[in_a[0]]["provision_state"] == "enroll"
    assert ours[in_a[0]]["properties"]["memory_mb"] == 65536

    default = {n["uuid"] for n in list_nodes(client, fields=["uuid"], conductor_group="")}
    assert set(in_default) <= default
    assert not set(in_a) & default

    if ironic_server.page_size == 20:
        # without limit=0 the client returns one page of [api]max_limit nodes
        assert len(client.node.list(fields=["uuid"], conductor_group="group-a")) == 20
    # limit=0 follows all pages and, with no filter, sees every node
    everything = {n.uuid for n in client.node.list(limit=0, fields=["uuid"])}
    assert mine <= everything

    ironic_nodes.make_available(in_default[:2])
    states = {client.node.get(u, fields=["provision_state"]).provision_state
              for u in in_default[:2]}
    assert states == {"available"}


@pytest.mark.xfail(reason="Ironic's next links drop conductor_group (and most other filters): "
                          "client.node.list(limit=0, conductor_group=...) leaks other groups "
                          "past the first page; use ironic_env.list_nodes",
                   raises=AssertionError, strict=False)
def test_ironicclient_limit0_keeps_group_filter_across_pages(ironic_server,  # noqa: F811
                                                             ironic_nodes):  # noqa: F811
    if ironic_server.page_size is None or "group-a" not in ironic_server.groups:
        pytest.skip("needs the session Ironic (page size 20, group-a)")
    # more than a page in group-a, then nodes of another group after them (higher ids)
    in_a = ironic_nodes.create(ironic_server.page_size + 1, conductor_group="group-a")
    other = ironic_nodes.create(3, conductor_group="")
    listed = ironic_nodes.client.node.list(limit=0, fields=["uuid", "conductor_group"],
                                           conductor_group="group-a")
    assert set(in_a) <= {n.uuid for n in listed}
    assert not set(other) & {n.uuid for n in listed}


def test_restart_keeps_database(ironic_server, ironic_nodes):  # noqa: F811
    server = ironic_server.require_managed()
    client = ironic_nodes.client
    uuids = ironic_nodes.create(3, conductor_group="group-b", instance_uuids=True)

    server.stop_process("api", sig=signal.SIGKILL)  # a crash: no graceful unregistering
    try:
        # refused, or reset when the client reuses a pooled connection to the dead server
        with pytest.raises((ironic_exc.ConnectionRefused, ksa_exc.ConnectionError)):
            client.node.list(limit=0, fields=["uuid"])
    finally:
        server.start_process("api")  # same port, config and database; waits until ready

    listed = {n["uuid"]: n for n in list_nodes(client, fields=["instance_uuid"],
                                               conductor_group="group-b")}
    assert set(uuids) <= set(listed)
    assert all(listed[u]["instance_uuid"] for u in uuids)
