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

"""Functional fixtures: the session's real Ironic (see ironic_env.py) and
the cluster each test starts from."""

import pytest

from tests.functional.ironic_env import ironic_client  # noqa: F401
from tests.functional.ironic_env import ironic_nodes  # noqa: F401
from tests.functional.ironic_env import ironic_server  # noqa: F401


@pytest.fixture
def cluster(started_cluster):
    """The module's ``started_cluster``, in the state each test starts from:
    its ``ready()`` rebuilds what an earlier test (or a failure) changed, so
    a test runs alone (``pytest path::Class::test[backend]``) or after any
    other."""
    started_cluster.ready()
    return started_cluster
