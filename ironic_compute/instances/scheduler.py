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

"""Which host builds a new instance: pure, no I/O.

As the multiple-compute-host spec asks, the scheduler picks a compute
*host*, not a node: the host picks the node when it reserves it in Ironic.
Among the live services that hold at least one free node matching the
request, the one with the fewest instances wins (the instance-count filter:
instances spread evenly); ties go to the host with more free nodes, then to
the first name, so that two schedulers given the same facts agree.

Free nodes are counted up to FREE_NODES_COUNTED per host: a request reads
that many free nodes of each host at most, whatever the size of the cloud,
and hosts with more are equally roomy (the tie goes to the first name).
"""

import dataclasses

from ironic_compute import exception

# Beyond this many free nodes (less its waiting builds) a host is no
# roomier than another.
FREE_NODES_COUNTED = 8


@dataclasses.dataclass(frozen=True)
class HostState:
    host: str
    free_nodes: int  # free nodes matching the request, less pending builds
    instances: int  # live instances the host manages, any state


def pick_host(states, why_none='no free node'):
    """The host to build on; NoValidHost (one line) when there is none.

    ``why_none`` says what did not match, for the refusal.
    """
    states = list(states)
    fit = [s for s in states if s.free_nodes > 0]
    if not fit:
        if not states:
            raise exception.NoValidHost('no live ironic-compute service to build on')
        raise exception.NoValidHost(f'{why_none}, on the {len(states)} live '
                                    'services')
    best = min(fit, key=lambda s: (
        s.instances, -min(s.free_nodes, FREE_NODES_COUNTED), s.host))
    return best.host


def fewest_instances(instances):
    """{host: live instances} -> the hosts with the fewest, sorted.

    pick_host ranks by instances first: when one of these hosts has a free
    node, it wins over every other host, so the others' free nodes need not
    be counted.
    """
    if not instances:
        return []
    fewest = min(instances.values())
    return sorted(host for host, count in instances.items() if count == fewest)
