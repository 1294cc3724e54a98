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

"""Do the services of a partition agree on the ring? Pure, no I/O.

Services that share a partition must build the same ring, or a node's
owner differs from one service to the next and its row changes hands at
every cycle. Each service records the settings that shape its ring in its
``services`` row; this compares them.
"""

import json

from ironic_compute.cluster import hosts
from ironic_compute.ring import assignment

# What shapes who owns what. replicas only orders the standbys.
RING_KEYS = ('partition_exponent', 'load_factor', 'peer_list')


def ring_settings(partition_exponent, load_factor, peer_list,
                  partition_key=None):
    """The settings a service records, as stable JSON.

    Recorded as they act: every load factor of 1 or less (or not finite)
    is plain hashing, and peer_list counts only with a partition key.
    """
    if not assignment.loads_bounded(load_factor):
        load_factor = 1.0
    return json.dumps({
        'partition_exponent': partition_exponent,
        'load_factor': load_factor,
        'peer_list': sorted(hosts.parse_list(peer_list)) if partition_key else [],
    }, sort_keys=True)


def recorded(text):
    """The settings a service recorded, as a dict (None: none, unreadable)."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def disagreements(mine, others):
    """What differs between ``mine`` and each other service's settings.

    ``others`` maps host -> recorded JSON (None: an older service that
    records nothing, which cannot be compared). Returns {host: 'what'}.
    """
    own = recorded(mine)
    if own is None:
        return {}  # nothing recorded here yet: nothing to compare with
    found = {}
    for host, text in sorted(others.items()):
        theirs = recorded(text)
        if theirs is None:
            continue
        differing = [f'{key} {theirs.get(key)!r} (here {own.get(key)!r})'
                     for key in RING_KEYS if theirs.get(key) != own.get(key)]
        if differing:
            found[host] = ', '.join(differing)
    return found


def partition_disagreements(records):
    """For the upgrade check: {partition: {host: 'what'}} among ``records``.

    ``records`` are (host, partition, settings JSON) of the live services.
    Each partition is compared with its first host (by name) that has
    recorded settings: an older release, or a service before its first
    cycle, records none and is left out.
    """
    by_partition = {}
    for host, partition, settings in sorted(records):
        if recorded(settings) is not None:
            by_partition.setdefault(partition, []).append((host, settings))
    found = {}
    for partition, members in by_partition.items():
        first_host, first = members[0]
        differing = disagreements(first, dict(members[1:]))
        if differing:
            found[partition] = {first_host: 'reference', **differing}
    return found
