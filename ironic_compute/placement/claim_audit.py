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

"""``placement audit``'s claims: read what placement/audit.py judges, and
``--fix`` what it says may be fixed.

A leaked claim is deleted only when its provider is one of this database's
nodes and its instance was deleted more than audit.LEAK_AGE ago (and Ironic
no longer has the node serving it); a claim of a consumer this database
never had is left alone. A missing claim is made only for a live instance
on one of this database's nodes whose provider nobody holds; the row is
read again before and after, and a claim made for an instance that began
to go meanwhile is given back (its delete may have released the claim
already).
"""

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.db import instances as db_instances
from ironic_compute.placement import audit
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)


def survey(ctx, client, nodes, rows, states):
    """The claim findings of the partition (see audit.claim_findings):
    ``nodes`` {uuid: ironic.Node}, ``rows`` {uuid: host}, ``states``
    {uuid: provider.State or None}. Raises exception.PlacementError."""
    allocations = {uuid: sorted(client.provider_allocations(uuid))
                   for uuid in sorted(nodes) if states.get(uuid) is not None}
    consumers = {c for held in allocations.values() for c in held}
    now, found = db_instances.claim_holders(ctx, consumers)
    holders = {r[0]: audit.Holder(*r) for r in found}
    return audit.claim_findings(nodes, rows, states, allocations, holders, now)


def _still_wants_it(ctx, finding):
    """The live row of the finding's instance, if it still needs its claim."""
    row = db_instances.get(ctx, finding.instance)
    if row is None or row.node != finding.node or row.task_state in audit.FREEING:
        return None
    return row


def _claim(ctx, claims, finding, default_owner):
    row = _still_wants_it(ctx, finding)
    if row is None:
        return False
    owner = (row.project_id or default_owner[0], row.user_id or default_owner[1])
    if not claims.claim_in_use(finding.instance, finding.node, *owner):
        return False
    if _still_wants_it(ctx, finding) is None:
        claims.release(finding.instance)
        return False
    LOG.info('Instance %s: claimed node %s in Placement', finding.instance,
             finding.node)
    return True


def _release(ctx, claims, finding):
    if db_instances.get(ctx, finding.instance) is not None:
        return False  # live again: an instance add of the same uuid
    claims.release(finding.instance)
    LOG.info('Instance %s: its leaked claim on node %s is deleted',
             finding.instance, finding.node)
    return True


def fix(ctx, claims, findings, default_owner):
    """Mend the fixable claim findings; how many were. ``claims``:
    placement.claims.Claims; ``default_owner``: (project, user) of a claim
    whose instance has none. A finding Placement refuses (403 included:
    the reshaper's role) is logged and left for the audit to list again;
    Placement unavailable raises exception.PlacementUnavailable."""
    fixed = 0
    for finding in findings:
        if not finding.fixable or finding.problem not in (audit.LEAKED,
                                                          audit.UNCLAIMED):
            continue
        try:
            if finding.problem == audit.LEAKED:
                fixed += _release(ctx, claims, finding)
            else:
                fixed += _claim(ctx, claims, finding, default_owner)
        except exception.PlacementUnavailable as exc:
            if exc.status != 403:
                raise
            # Our credentials lack the reshaper's role (service, by
            # default): the other findings may still be fixed.
            LOG.warning('Instance %s on node %s: not claimed: %s (give the '
                        '[placement] user Placement\'s service role)',
                        finding.instance, finding.node, one_line(exc))
        except (exception.PlacementConflict, exception.PlacementRefused,
                exception.PlacementNotFound) as exc:
            LOG.warning('Instance %s on node %s: not fixed: %s',
                        finding.instance, finding.node, one_line(exc))
    return fixed
