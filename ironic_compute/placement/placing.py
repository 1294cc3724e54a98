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

"""``instance create`` with Placement: the scheduler's host, a claim among
its free nodes, then the build request recorded on the claimed node.

The SQL scheduler chooses the host as without Placement and lists a few of
its free matching nodes (db/scheduling.py). Placement's allocation
candidates (resource class, traits, ``member_of`` the conductor group's
aggregate), narrowed to those nodes, give the node; ``PUT
/allocations/{instance}`` claims it (placement/claims.py). Only then is the
row recorded, naming the node, which its build reserves in Ironic and no
other. A row that cannot be recorded gives its claim back, once a read
shows that it is not there: an insert that failed may have been committed
with its answer lost, and a recorded row keeps its claim.

Placement, not the schedulers' lock, keeps two schedulers (of this
database or another, or a third consumer of the same Placement) off one
node: the second claim is refused and the next candidate is tried. When
Placement has none of the chosen host's free nodes left (claimed meanwhile,
or reserved there), the scheduler chooses again without that host, at most
MAX_HOSTS times: a create does not fail while a node is free.
"""

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.db import instances as db_instances
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.instances import scheduler
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# Hosts tried, each chosen by the scheduler without the ones before it.
MAX_HOSTS = 5
# Free nodes of the chosen host offered to Placement's candidates: more
# than a host is counted for, so that schedulers racing for one host each
# find another.
NODES_OFFERED = 2 * scheduler.FREE_NODES_COUNTED


def schedule_claim_and_create(ctx, claims, uuid, name, spec, image_source,
                              service_down_time, owner, host=None, **extra):
    """Choose the host, claim one of its free nodes for instance ``uuid``
    in Placement (``claims``: placement.claims.Claims; ``owner``: the
    (project id, user id) of the claim) and record the request on that
    node; the row recorded.

    Raises what db_scheduling.schedule_and_create raises, NoValidHost (or
    RequestRefused for ``host``) when Placement has no free node left among
    those of the hosts tried, and exception.PlacementError when Placement
    fails; nothing is recorded then, and no claim is left.
    """
    hosts = db_scheduling.candidate_hosts(ctx, spec, service_down_time, host)
    tried = []
    for _attempt in range(MAX_HOSTS):
        left = [h for h in hosts if h not in tried]
        if not left:
            break
        chosen, free = _choose(ctx, spec, left, host, tried)
        node = _claim(claims, uuid, spec, free, owner)
        if node is None:
            LOG.info('Instance %s: Placement has none of the %d free nodes '
                     'of %s left; choosing again', uuid, len(free), chosen)
            tried.append(chosen)
            continue
        try:
            return db_scheduling.create_on_node(
                ctx, uuid, name, spec, image_source, chosen, node, **extra)
        except exception.NodeTaken as exc:
            # Recorded meanwhile by a scheduler that does not claim.
            LOG.info('Instance %s: %s; choosing again', uuid, exc)
            give_back(claims, uuid)
        except exception.RequestRefused:
            give_back(claims, uuid)  # the lock stayed busy: nothing written
            raise
        except BaseException as exc:
            # The COMMIT may have landed with its answer lost (or an
            # interrupt came after it): read, then decide.
            row = _recorded_or_given_back(ctx, claims, uuid)
            if row is None or not isinstance(exc, Exception):
                raise
            LOG.warning('Instance %s: recorded, though the database answered '
                        '%s', uuid, one_line(exc))
            return row
    raise _none_left(spec, tried, host)


def _recorded_or_given_back(ctx, claims, uuid):
    """After an insert that failed: the row of ``uuid`` if it was recorded
    all the same (its claim is kept), else None once the claim is given
    back. When the row cannot be read, nothing is given back (the row may
    stand, and its build needs the claim) and the log says what removes
    the claim if the instance is not recorded; None."""
    try:
        row = db_instances.get(ctx, uuid)
    except BaseException as exc:
        LOG.error('Instance %s: whether it was recorded cannot be read (%s); '
                  'its claim in Placement is kept. If "instance show %s" '
                  'does not find it, remove the claim with DELETE '
                  '/allocations/%s', uuid, one_line(exc), uuid, uuid)
        return None
    if row is None:
        give_back(claims, uuid)
    return row


def _choose(ctx, spec, hosts, host, tried):
    """The scheduler's (host, free nodes) among ``hosts``; its refusal
    says which hosts Placement had nothing left on."""
    try:
        return db_scheduling.choose_with_free_nodes(
            ctx, spec, hosts, NODES_OFFERED, host)
    except (exception.NoValidHost, exception.RequestRefused) as exc:
        if not tried:
            raise
        refusal = type(exc)(f'{exc}; {_none_left(spec, tried, host)}')
    raise refusal


def _claim(claims, uuid, spec, free, owner):
    """The node claimed among ``free``, or None; a claim whose answer
    was lost (or that an interrupt cut short) is given back before the
    error is raised."""
    try:
        return claims.claim_one(uuid, spec.resource_class, spec.traits,
                                spec.partition_key, set(free), *owner)
    except BaseException:
        # Also an interrupt: a claim made before it has no row to be
        # released with.
        give_back(claims, uuid)
        raise


def _none_left(spec, tried, host):
    why = (f'Placement has no free node left for {spec.describe()} among '
           f'the free nodes of {", ".join(tried) or "no service"} (claimed '
           'or reserved there)')
    if host is not None:
        return exception.RequestRefused(why)
    return exception.NoValidHost(why)


def give_back(claims, uuid):
    """Release the claim of ``uuid`` (if any) after a create that records
    nothing. A Placement failure is logged, with what removes the claim:
    no row names the instance, so no service will."""
    try:
        claims.release(uuid)
    except exception.PlacementError as exc:
        LOG.error('Instance %s: recorded nothing, but its claim in Placement '
                  'could not be given back (%s); remove it with DELETE '
                  '/allocations/%s', uuid, one_line(exc), uuid)
