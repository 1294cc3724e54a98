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

"""Fixtures of every unit test."""

import pytest

from ironic_compute.ring import assignment
from ironic_compute.ring import hash_ring


@pytest.fixture(autouse=True)
def _empty_ring_caches():
    # A ring or an assignment cached by one test must not serve another:
    # each test builds its own, as a process that just started would.
    hash_ring.clear_ring_cache()
    assignment.clear_cache()
    yield
    hash_ring.clear_ring_cache()
    assignment.clear_cache()


@pytest.fixture
def cloud(migrated_engine):
    """Services a and b on a fake Ironic (tests/unit/instance_cloud.py), on
    each database backend."""
    from tests.unit import instance_cloud
    return instance_cloud.make_cloud()
