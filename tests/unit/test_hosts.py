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

"""Host names: normalised in one place (case and blanks do not matter)."""

import pytest

from ironic_compute.cluster import hosts


def test_case_and_blanks_do_not_make_another_host():
    assert hosts.normalize(' Compute-1 ') == 'compute-1'
    assert hosts.normalize_all(['A', 'a ', 'b']) == frozenset({'a', 'b'})


@pytest.mark.parametrize('bad, error', [
    ('compute-1', TypeError),  # one string, not a list of names
    (['a', ''], ValueError),
    (['a', ' '], ValueError),
    (['a', 3], TypeError),
])
def test_a_host_list_refuses_what_is_not_a_list_of_names(bad, error):
    with pytest.raises(error):
        hosts.normalize_all(bad)


def test_a_peer_list_from_an_option_value_or_a_list():
    assert hosts.parse_list('Compute-1, compute-2,,') == frozenset(
        {'compute-1', 'compute-2'})
    assert hosts.parse_list([' X ', '']) == frozenset({'x'})
    assert hosts.parse_list(None) == frozenset()
