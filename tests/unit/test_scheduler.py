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

"""The scheduler's choice (pure): fewest instances, then free nodes (up to
FREE_NODES_COUNTED), then the first name; one-line refusals."""

import pytest

from ironic_compute import exception
from ironic_compute.instances import scheduler
from ironic_compute.instances.scheduler import HostState


def test_the_host_with_the_fewest_instances_wins():
    assert scheduler.pick_host([HostState('a', 1, 5), HostState('b', 9, 6),
                                HostState('c', 3, 2)]) == 'c'


def test_hosts_without_a_free_node_are_not_candidates():
    assert scheduler.pick_host([HostState('a', 0, 0), HostState('b', 1, 9),
                                HostState('c', -2, 0)]) == 'b'


def test_ties_go_to_more_free_nodes_up_to_the_counted_ones_then_the_name():
    assert scheduler.pick_host([HostState('a', 2, 1),
                                HostState('b', 3, 1)]) == 'b'
    many = scheduler.FREE_NODES_COUNTED
    assert scheduler.pick_host([HostState('b', many + 5, 1),
                                HostState('a', many, 1)]) == 'a'


def test_the_choice_does_not_depend_on_the_order_of_the_states():
    states = [HostState(h, f, i) for h, f, i in
              (('c', 2, 1), ('a', 2, 1), ('b', 1, 1))]
    assert {scheduler.pick_host(states),
            scheduler.pick_host(reversed(states))} == {'a'}


def test_refusals_say_why_in_one_line():
    with pytest.raises(exception.NoValidHost,
                       match='^no live ironic-compute service to build on$'):
        scheduler.pick_host([])
    with pytest.raises(exception.NoValidHost) as refused:
        scheduler.pick_host([HostState('a', 0, 1), HostState('b', 0, 0)],
                            'no free node for resource class gpu')
    assert str(refused.value) == ('no free node for resource class gpu, on '
                                  'the 2 live services')


def test_the_hosts_with_the_fewest_instances_are_considered_first():
    assert scheduler.fewest_instances({'c': 1, 'b': 0, 'a': 0, 'd': 2}) == [
        'a', 'b']
    assert scheduler.fewest_instances({'a': 3}) == ['a']
    assert scheduler.fewest_instances({}) == []


def test_a_host_among_the_fewest_that_fits_wins_over_every_other():
    # Why the database counts the free nodes of those hosts first.
    states = [HostState('a', 0, 0), HostState('b', 1, 0),
              HostState('c', 8, 1), HostState('d', 8, 2)]
    first = scheduler.fewest_instances({s.host: s.instances for s in states})
    assert scheduler.pick_host(states) == scheduler.pick_host(
        [s for s in states if s.host in first]) == 'b'
