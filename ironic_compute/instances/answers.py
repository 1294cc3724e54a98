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

"""What the provisioning calls answer: the states of nodes and
allocations as Ironic reports them (the errors of a call are in
exception.py).

Pure data: no I/O. ``node_state`` turns ironicclient's node into a
NodeState, stamped with the time its request began.
"""

import dataclasses

from ironic_compute import redaction

# Provision states a deploy or undeploy ends in, and those that mean it failed.
DEPLOY_DONE, DEPLOY_FAILED = 'active', ('deploy failed', 'error')
UNDEPLOY_DONE, UNDEPLOY_FAILED = 'available', ('clean failed', 'error',
                                               'manageable')
# A node in these can be undeployed ('deleted').
UNDEPLOYABLE = ('active', 'deploy failed', 'error', 'wait call-back',
                'rescue', 'rescue failed', 'rescue wait', 'unrescue failed')


@dataclasses.dataclass(frozen=True)
class Allocation:
    uuid: str
    state: str  # allocating, active, error
    node_uuid: str | None
    last_error: str | None
    # Made by this call of allocate() (not found made by an earlier one):
    # Ironic gave it a node that was available, with no action under way.
    created: bool = False



@dataclasses.dataclass(frozen=True)
class NodeState:
    uuid: str
    provision_state: str | None
    target_provision_state: str | None
    instance_uuid: str | None
    allocation_uuid: str | None
    last_error: str | None
    maintenance: bool
    power_state: str | None = None  # Ironic's: 'power on', 'power off'...
    target_power_state: str | None = None
    # When Ironic last began a power action on the node
    # (driver_internal_info), and last changed its provision state: what
    # an action records before its call, so that a worker resuming it sees
    # whether the call was carried out already.
    last_power_state_change: str | None = None
    provision_updated_at: str | None = None
    # When the request that read this began (time.monotonic()): a waiter
    # takes as done only what a read that began after its call was answered
    # says (Provisioner.poll_node).
    read_at: float = 0.0
    # instance_info's image_source, when the read asked for instance_info
    # (a rebuild's: it patches the image only when it changes); nothing
    # else of instance_info is kept, as it may carry what a tenant gave.
    image_source: str | None = None
    # The node's lessee (Ironic API 1.65), when the read asked for it.
    lessee: str | None = None



# Power states Ironic ends a power action in.
POWER_ON, POWER_OFF = 'power on', 'power off'


@dataclasses.dataclass(frozen=True)
class Serving:
    """Whom a node serves, as an answer about it says (what a fence checks
    of a node): the node's instance_uuid and allocation_uuid."""
    uuid: str
    instance_uuid: str | None
    allocation_uuid: str | None



def node_state(raw, read_at):
    """The NodeState of a node as ironicclient gives it (read or listed)
    by a request that began at ``read_at``; a field it was not asked for
    is None."""
    internal = getattr(raw, 'driver_internal_info', None) or {}
    return NodeState(raw.uuid, raw.provision_state,
                     raw.target_provision_state, raw.instance_uuid,
                     getattr(raw, 'allocation_uuid', None),
                     redaction.url_credentials(raw.last_error),
                     bool(raw.maintenance),
                     getattr(raw, 'power_state', None),
                     getattr(raw, 'target_power_state', None),
                     internal.get('last_power_state_change'),
                     getattr(raw, 'provision_updated_at', None), read_at,
                     (getattr(raw, 'instance_info', None) or {}).get(
                         'image_source'), getattr(raw, 'lessee', None))

