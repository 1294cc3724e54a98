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

"""Claims: an instance's one unit of a node's resource class, held in
Placement by an allocation whose consumer is the instance.

Placement refuses an allocation beyond a provider's capacity (409) in one
transaction, so two schedulers anywhere, or any third consumer of the same
Placement, never claim one provider twice: whoever is second gets the
refusal and tries the next candidate. A claim is idempotent per instance: a
consumer that exists already (our own earlier attempt, cut off before the
answer) holding the same provider is our claim.

Measured here (openstack-placement 16.0.0 on MariaDB, REPEATABLE READ, two
gunicorn workers): under concurrent claims for the same providers Placement
itself sometimes writes two allocations on a provider of capacity 1 (about
one run in five with 12 claims racing for 3 providers). Its server-side
retry after a generation conflict re-reads the provider's generation in a
new transaction but checks the capacity in the snapshot of the request's
first one. So every claim is checked after it is made: the provider must
hold our allocation alone; otherwise ours is given back and the next
candidate tried. Two claimers that both see the double both back out; a
claimer that saw itself alone was first, and every later one sees it.
"""

import random
import time

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import provider

LOG = logging.getLogger(__name__)

# Attempts to claim one provider while its generation keeps changing.
MAX_ATTEMPTS = 3
# Rounds of candidates when claims were given back for a double, and the
# longest random pause (seconds) between two.
MAX_ROUNDS = 5
PAUSE = 0.05


class Claims:
    """Claim and release nodes' providers for instances."""

    def __init__(self, client):
        self.client = client
        self._gave_back = False  # in this round of claim_one

    @classmethod
    def from_conf(cls, conf):
        """Claims for ``conf``, or None when [placement] is not configured
        (then nothing is ever claimed or released)."""
        if not placement_client.configured(conf):
            return None
        return cls(placement_client.PlacementClient(conf))

    def candidates(self, resource_class, traits=(), conductor_group=None,
                   among=None):
        """The node uuids whose providers can take the instance now, in
        Placement's order: one unit of the (normalised) resource class, every
        trait of ``traits``, ``member_of`` the conductor group's aggregate
        (None: any group), and among the uuids ``among`` (None: any)."""
        aggregate = (None if conductor_group is None
                     else provider.aggregate_uuid(conductor_group))
        found = self.client.allocation_candidates(
            provider.normalize_resource_class(resource_class), traits,
            aggregate)
        return [u for u in found if among is None or u in among]

    def claim(self, instance, node, resource_class, project_id, user_id):
        """Whether the instance now holds ``node``'s provider (False: taken
        by another consumer, or no capacity left)."""
        resources = {provider.normalize_resource_class(resource_class): 1}
        for _attempt in range(MAX_ATTEMPTS):
            try:
                self.client.put_allocations(instance, {node: resources},
                                            project_id, user_id)
                return self._alone(instance, node)
            except exception.PlacementConflict as exc:
                if not exc.generation_changed:
                    # No capacity left: another consumer holds it.
                    LOG.info('Instance %s: provider of node %s not claimed: '
                             '%s', instance, node, exc)
                    return False
                # The consumer exists (ours: an earlier attempt whose answer
                # was lost), or the provider changed while we allocated.
                _generation, held = self.client.get_allocations(instance)
                if held == {node: resources}:
                    return self._alone(instance, node)
                if held:
                    raise exception.PlacementRefused(
                        f'instance {instance} holds other allocations: '
                        f'{sorted(held)}') from exc
        LOG.info('Instance %s: provider of node %s changed at each of %d '
                 'attempts; not claimed', instance, node, MAX_ATTEMPTS)
        return False

    def _alone(self, instance, node):
        """Whether the instance's is the only allocation on the node's
        provider; if not, it is given back (see the module docstring)."""
        others = set(self.client.provider_allocations(node)) - {instance}
        if not others:
            return True
        LOG.warning('Instance %s: Placement gave node %s to %s too; giving '
                    'it back', instance, node, ', '.join(sorted(others)))
        self.release(instance)
        self._gave_back = True
        return False

    def claim_one(self, instance, resource_class, traits, conductor_group,
                  among, project_id, user_id):
        """The node claimed for the instance among the candidates, or None
        when Placement has none left.

        A claim given back for a double (see the module docstring) may leave
        its provider free again: the candidates are asked for again, after
        a short random pause, at most MAX_ROUNDS times."""
        for _round in range(MAX_ROUNDS):
            found = self.candidates(resource_class, traits, conductor_group,
                                    among)
            self._gave_back = False
            for node in found:
                if self.claim(instance, node, resource_class, project_id,
                              user_id):
                    return node
            if not found or not self._gave_back:
                return None
            time.sleep(random.uniform(0, PAUSE))
        return None

    def claim_in_use(self, instance, node, project_id, user_id):
        """Claim ``node``'s provider for an instance already on the node
        (built before Placement was turned on, or whose claim was lost):
        whether the instance now holds it alone.

        Such a provider is reserved (the node carries an instance), and
        Placement refuses a claim on a reserved unit. One ``POST
        /reshaper`` lifts the reserved flag and writes the allocation in a
        single transaction, so the unit is never free for another consumer
        meanwhile; then the inventory is written back as it was (on a
        conflict, the node's owner writes it at its next refresh). Raises
        exception.PlacementConflict when the provider changed meanwhile,
        exception.PlacementRefused when it has not one resource class."""
        generation, inventories = self.client.get_inventories(node)
        if len(inventories) != 1:
            raise exception.PlacementRefused(
                f'provider of node {node} has inventories '
                f'{sorted(inventories)}, not one resource class')
        (resource_class,) = inventories
        lifted = {rc: dict(record, reserved=0) for rc, record in inventories.items()}
        self.client.reshape({node: (generation, lifted)},
                            {instance: ({node: {resource_class: 1}},
                                        project_id, user_id)})
        try:
            generation, _now = self.client.get_inventories(node)
            self.client.put_inventories(node, generation, inventories)
        except exception.PlacementConflict:
            LOG.info('Node %s: provider changed after the claim of %s; its '
                     'owner writes its reserved flag', node, instance)
        return self._alone(instance, node)

    def holder(self, instance):
        """The node whose provider the instance holds, or None."""
        _generation, held = self.client.get_allocations(instance)
        return next(iter(held), None)

    def release(self, instance):
        """The instance holds nothing in Placement any more (idempotent)."""
        try:
            self.client.delete_allocations(instance)
        except exception.PlacementNotFound:
            pass
