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

"""The test harness's node listing against a connection the server closed."""

import types

import pytest
from keystoneauth1 import exceptions as ks_exceptions

from ironic_compute.harness import ironic_nodes


class Api:
    """client.node.api: answers ``pages`` in turn, after ``drops``
    ConnectFailures (a kept-alive connection the server had closed)."""

    def __init__(self, pages, drops):
        self.pages, self.drops, self.urls = list(pages), drops, []

    def json_request(self, method, url):
        self.urls.append((method, url))
        if self.drops:
            self.drops -= 1
            raise ks_exceptions.ConnectFailure('Remote end closed connection')
        return None, self.pages.pop(0)


def client(api):
    return types.SimpleNamespace(node=types.SimpleNamespace(api=api))


def test_a_listing_whose_connection_was_dropped_is_sent_once_more():
    # The chaos soak's CI failure: Ironic closed the harness's idle
    # connection, and its next listing found it closed.
    api = Api([{'nodes': [{'uuid': 'a'}]}], drops=1)
    assert ironic_nodes.list_nodes(client(api), conductor_group='g') == [
        {'uuid': 'a'}]
    assert len(api.urls) == 2 and api.urls[0] == api.urls[1]


def test_a_listing_dropped_twice_fails():
    api = Api([{'nodes': []}], drops=2)
    with pytest.raises(ks_exceptions.ConnectFailure):
        ironic_nodes.list_nodes(client(api))


class Allocations:
    """client.allocation: answers ``listing`` after ``drops`` ConnectFailures."""

    def __init__(self, listing, drops):
        self.listing, self.drops, self.calls = listing, drops, 0

    def list(self, **params):
        self.calls += 1
        if self.drops:
            self.drops -= 1
            raise ks_exceptions.ConnectFailure('Remote end closed connection')
        return [types.SimpleNamespace(to_dict=lambda a=a: a) for a in self.listing]


def test_an_allocation_listing_whose_connection_was_dropped_is_sent_once_more():
    # test_fencing's CI failure: the agreement check's allocation listing
    # found its kept-alive connection closed.
    allocations = Allocations([{'uuid': 'x', 'name': 'i'}], drops=1)
    listed = ironic_nodes.list_allocations(types.SimpleNamespace(allocation=allocations))
    assert listed == [{'uuid': 'x', 'name': 'i'}] and allocations.calls == 2


def test_an_allocation_listing_dropped_twice_fails():
    allocations = Allocations([], drops=2)
    with pytest.raises(ks_exceptions.ConnectFailure):
        ironic_nodes.list_allocations(types.SimpleNamespace(allocation=allocations))
