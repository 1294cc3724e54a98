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

"""What a node's resource provider should hold: pure, no I/O.

The rules are Nova's ironic driver's (``update_provider_tree``): one unit of
the node's normalised resource class, reserved while the node cannot take a
new instance; the node's traits; and, ours, one aggregate per conductor
group so that a claim can ask for ``member_of`` the partition.
"""

import dataclasses
import re
import uuid as uuidlib

CUSTOM_PREFIX = 'CUSTOM_'
# Nova's resource tracker marks every compute node provider with this
# standard trait so that other services can find them; we do the same. It
# adds no capability trait of its virt driver (those describe Nova's API).
SERVICE_TRAITS = frozenset({'COMPUTE_NODE'})
# The namespace of the conductor groups' aggregate uuids: a fixed value, so
# that every service, every release, derives the same uuid for a group.
AGGREGATE_NAMESPACE = uuidlib.UUID('5f4bd4ae-1e7c-4d1a-9c2a-7b1c3e0a9d21')

# Why a node's one unit is reserved (None: it is not).
MAINTENANCE = 'maintenance'
POWER_ERROR = 'power state error'
POWER_UNKNOWN = 'power state unknown'
NOT_AVAILABLE = 'provision state {state}'
INSTANCE = 'has an instance'
NO_RESOURCE_CLASS = 'no resource class'


def normalize_resource_class(name):
    """Nova's rule: upper case, every run of other characters than A-Z and
    0-9 becomes one '_', and ``CUSTOM_`` in front unless it is there.
    None for an empty or missing name."""
    if not name:
        return None
    normalized = re.sub('[^0-9A-Z]+', '_', name.upper())
    if not normalized.startswith(CUSTOM_PREFIX):
        normalized = CUSTOM_PREFIX + normalized
    return normalized


def aggregate_uuid(conductor_group):
    """The aggregate of a conductor group ('' is the default group): the
    same uuid for the same group on every service."""
    group = (conductor_group or '').strip().lower()
    return str(uuidlib.uuid5(AGGREGATE_NAMESPACE, f'conductor_group:{group}'))


def reserved_reason(node):
    """Why the node's unit is reserved, or None when it is free to claim:
    in maintenance, power state error or unknown, provision state other than
    ``available``, or an instance on it."""
    if node.maintenance:
        return MAINTENANCE
    if node.power_state == 'error':
        return POWER_ERROR
    if node.power_state is None:
        return POWER_UNKNOWN
    if node.provision_state != 'available':
        return NOT_AVAILABLE.format(state=node.provision_state)
    if node.instance_uuid:
        return INSTANCE
    return None


@dataclasses.dataclass(frozen=True)
class State:
    """What a provider holds, in the parts this service manages.

    ``inventory``: {resource class: {field: value}} as Placement takes it;
    ``traits`` and ``aggregates``: frozensets of names and uuids.
    """

    inventory: dict = dataclasses.field(hash=False)
    traits: frozenset
    aggregates: frozenset

    @property
    def resource_classes(self):
        return frozenset(self.inventory)


def inventory(node):
    """{resource class: record}: one unit, reserved as reserved_reason
    says; empty when the node has no resource class."""
    resource_class = normalize_resource_class(node.resource_class)
    if resource_class is None:
        return {}
    return {resource_class: {
        'total': 1,
        'reserved': 0 if reserved_reason(node) is None else 1,
        'min_unit': 1,
        'max_unit': 1,
        'step_size': 1,
        'allocation_ratio': 1.0,
    }}


def desired(node):
    """The State this service wants for ``node``'s provider (its own
    traits and aggregate only; see merged for the provider's whole sets)."""
    return State(inventory=inventory(node),
                 traits=frozenset(node.traits) | SERVICE_TRAITS,
                 aggregates=frozenset({aggregate_uuid(node.conductor_group)}))


def merged(ours, seen, managed_before):
    """The provider's whole State: ``ours`` (from desired), plus what
    ``seen`` on the provider (a State read from Placement) holds that this
    service did not set: traits and aggregates not in ``managed_before``
    (the traits and aggregates this service last set, or the best account
    of them) are an operator's, and kept.

    The inventory is ours alone: the resource class of a node is one unit.
    """
    kept_traits = seen.traits - managed_before.traits
    kept_aggregates = seen.aggregates - managed_before.aggregates
    return State(inventory=ours.inventory,
                 traits=ours.traits | kept_traits,
                 aggregates=ours.aggregates | kept_aggregates)


def custom_names(state):
    """(resource classes, traits) of ``state`` that Placement must be told
    of before they are used: the ``CUSTOM_`` ones."""
    return (frozenset(rc for rc in state.inventory
                      if rc.startswith(CUSTOM_PREFIX)),
            frozenset(t for t in state.traits if t.startswith(CUSTOM_PREFIX)))
