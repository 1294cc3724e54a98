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

"""The pure instance rules: request spec, node choice, takeover key,
scheduler (when a takeover is due: tests/unit/test_liveness.py)."""

import pytest

from ironic_compute import exception
from ironic_compute.instances import model as inst
from ironic_compute.instances import scheduler


def offer(uuid, rc='baremetal', vcpus=8, memory_mb=16384, local_gb=100,
          traits=(), available=True):
    return inst.NodeOffer(uuid, rc, vcpus, memory_mb, local_gb,
                          frozenset(traits), available)


def spec(**kwargs):
    return inst.RequestSpec(**{'resource_class': 'baremetal', **kwargs})


# --- request spec ----------------------------------------------------------

@pytest.mark.parametrize('kwargs, message', [
    ({'resource_class': ' '}, 'a resource class is required'),
    ({'vcpus': -1}, 'vcpus must not be negative'),
    ({'memory_mb': -5}, 'memory_mb must not be negative'),
])
def test_invalid_specs_are_refused(kwargs, message):
    with pytest.raises(exception.InvalidRequest, match=message):
        spec(**kwargs)


@pytest.mark.parametrize('value', [
    'baremetal', 'CUSTOM_GOLD', 'bm.large-2_x~y', 'r' * 80])
def test_resource_classes_ironic_takes_and_a_url_never_escapes(value):
    assert spec(resource_class=value).resource_class == value


@pytest.mark.parametrize('value', [
    'r' * 81,  # Ironic's column is 80 characters
    'baremetal&associated=True',  # a second filter in Ironic's query
    'bare metal', 'gpu/1', 'gpu?x', 'gpu#1', 'gpu%20', 'bm\nx', 'bé',
])
def test_resource_classes_that_would_reach_ironic_altered_are_refused(value):
    with pytest.raises(exception.InvalidRequest) as caught:
        spec(resource_class=value)
    message = str(caught.value)
    assert message.startswith('invalid resource class ')
    assert 'up to 80 letters, digits and "-", ".", "_", "~"' in message
    assert '\n' not in message and len(message) < 200


@pytest.mark.parametrize('value', [
    'CUSTOM_GOLD', 'CUSTOM_RAID_1', 'HW_CPU_X86_AVX2', 'STORAGE_DISK_SSD',
    'CUSTOM_' + 'X' * 248])
def test_traits_of_ironic_s_patterns(value):
    assert spec(traits=frozenset({value})).traits == {value}


@pytest.mark.parametrize('value', [
    'custom_gold', 'CUSTOM_', 'CUSTOM_GOLD-1', 'CUSTOM GOLD', 'hw_cpu_x86_avx2',
    '_HW', '1HW', '', 'CUSTOM_' + 'X' * 249, 'CUSTOM_A&traits=B', 42])
def test_traits_outside_ironic_s_patterns_are_refused(value):
    with pytest.raises(exception.InvalidRequest,
                       match=r'^invalid trait .*: a trait is a standard one '
                             r'\(such as HW_CPU_X86_AVX2\) or CUSTOM_ '):
        spec(traits=frozenset({'CUSTOM_OK', value}))


def test_spec_describes_only_what_was_asked():
    assert spec().describe() == 'resource class baremetal'
    assert spec(vcpus=4, disk_gb=20, traits={'B', 'A'},
                partition_key='rack-1').describe() == (
        'resource class baremetal, 4 vcpus, 20 GB disk, traits A,B, '
        'conductor group rack-1')


def test_traits_round_trip_through_json():
    s = spec(traits={'CUSTOM_B', 'CUSTOM_A'})
    assert s.traits_json() == '["CUSTOM_A", "CUSTOM_B"]'
    assert inst.parse_traits(s.traits_json()) == s.traits
    assert spec().traits_json() is None and inst.parse_traits(None) == frozenset()


# --- node choice -----------------------------------------------------------

def test_every_fitting_node_is_a_candidate_sorted():
    nodes = [offer('c'), offer('a'), offer('b', vcpus=2)]
    match = inst.match_nodes(spec(vcpus=4), nodes)
    assert match.candidates == ('a', 'c') and match.fault is None


@pytest.mark.parametrize('node, request_kwargs, reason', [
    (offer('n', available=False), {}, '1 not available'),
    (offer('n', rc='gpu'), {}, '1 of another resource class'),
    (offer('n', vcpus=2), {'vcpus': 4}, '1 with too few vcpus'),
    (offer('n', memory_mb=10), {'memory_mb': 11}, '1 with too little memory'),
    (offer('n', local_gb=10), {'disk_gb': 11}, '1 with too little disk'),
    (offer('n', traits={'A'}), {'traits': frozenset({'A', 'B'})},
     '1 without the traits'),
])
def test_the_fault_names_what_did_not_match(node, request_kwargs, reason):
    match = inst.match_nodes(spec(**request_kwargs), [node])
    assert match.candidates == ()
    assert match.fault.startswith('no free node for resource class baremetal')
    assert match.fault.endswith(f'({reason})')


def test_capacity_equal_to_the_request_fits():
    node = offer('n', vcpus=4, memory_mb=1024, local_gb=10, traits={'A'})
    assert inst.match_nodes(spec(vcpus=4, memory_mb=1024, disk_gb=10,
                                 traits=frozenset({'A'})),
                            [node]).candidates == ('n',)


def test_nodes_of_other_instances_are_not_candidates_and_counted():
    nodes = [offer('a'), offer('b', rc='gpu')]
    match = inst.match_nodes(spec(), nodes, busy={'a'})
    assert match.candidates == ()
    assert '1 taken by another instance' in match.fault
    assert '1 of another resource class' in match.fault


def test_no_node_at_all():
    assert inst.match_nodes(spec(), []).fault == (
        'no free node: this host has no node for resource class baremetal')


# --- state machine ---------------------------------------------------------

def test_next_action_per_task_state():
    assert inst.next_action(inst.SCHEDULED) == 'build'
    assert inst.next_action(inst.SPAWNING) == 'build'
    assert inst.next_action(inst.DELETING) == 'delete'
    assert inst.next_action(inst.RELEASING) == 'release'
    assert inst.next_action(None) is None


# --- takeover --------------------------------------------------------------

def test_the_takeover_key_is_the_node_else_the_instance():
    assert inst.takeover_key('node-1', 'inst-1') == 'node-1'
    assert inst.takeover_key(None, 'inst-1') == 'inst-1'


# --- scheduler -------------------------------------------------------------

def test_fewest_instances_wins_among_hosts_with_a_free_node():
    states = [scheduler.HostState('a', free_nodes=5, instances=3),
              scheduler.HostState('b', free_nodes=0, instances=0),
              scheduler.HostState('c', free_nodes=1, instances=2)]
    assert scheduler.pick_host(states) == 'c'


def test_ties_go_to_more_free_nodes_then_the_name():
    assert scheduler.pick_host([scheduler.HostState('b', 2, 1),
                                scheduler.HostState('a', 1, 1),
                                scheduler.HostState('c', 2, 1)]) == 'b'


def test_no_host_with_a_free_node_is_one_clear_line():
    with pytest.raises(exception.NoValidHost,
                       match=r'^no free node for x, on the 2 live services$'):
        scheduler.pick_host([scheduler.HostState('a', 0, 0),
                             scheduler.HostState('b', -1, 3)],
                            'no free node for x')
    with pytest.raises(exception.NoValidHost, match='no live ironic-compute'):
        scheduler.pick_host([])


def test_repeated_picks_spread_evenly():
    free = {'a': 10, 'b': 10, 'c': 10}
    counts = dict.fromkeys(free, 0)
    for _ in range(30):
        host = scheduler.pick_host(scheduler.HostState(h, free[h], counts[h])
                                   for h in free)
        counts[host] += 1
        free[host] -= 1
    assert sorted(counts.values()) == [10, 10, 10]


# --- the node re-check before an Ironic call ----------------------------------

@pytest.mark.parametrize('instance_uuid, allocation_uuid, refusal', [
    ('x', 'x', None),
    ('x', None, None),  # deployed without an allocation (instance add)
    ('y', 'y', 'node n serves y now'),
    (None, None, 'node n serves no instance now'),
    ('x', 'y', "node n carries allocation y, not this instance's"),
])
def test_a_node_is_acted_on_only_while_it_names_the_instance(
        instance_uuid, allocation_uuid, refusal):
    from ironic_compute.instances import answers
    node = answers.NodeState('n', 'active', None, instance_uuid,
                               allocation_uuid, None, False)
    assert inst.node_refusal(node, 'x') == refusal
    assert inst.node_refusal(None, 'x') == 'the node is gone from Ironic'
