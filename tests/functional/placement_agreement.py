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

"""Do Placement's providers and claims agree with Ironic and the database?

Checked at every sample of the chaos soak (doc/chaos-soak.md), right after
the agreement with Ironic (agreement.py), from the same sample: the
database was read first, then Ironic, then Placement's own tables
(``resource_providers`` and ``allocations``, by SQL: cheap). The rules:

``provider_remade``
    a node Ironic had at every sample since its provider was noted (at
    start-up, or when it first had one after coming back) has no provider,
    or one with another row id: deleted, or made a second time;
``provider_missing``
    a node back in Ironic (deleted and created again) still without a
    provider ``stale_bound`` seconds after a sample first saw it back (its
    provider then is noted, and must stay);
``provider_stale``
    a provider of a node that Ironic has not had for ``stale_bound``
    seconds (its owner deletes it at its next cycle after Ironic's 404);
``claim_missing``
    a live instance built by ``instance create`` whose row names a node,
    in no task that gives the claim back (``deleting``: the claim goes
    before the row; ``releasing``: a failed build's, after it wrote the
    failure), without an allocation on that node's provider, and the next
    sample's database read still finds it so (same node, no such task):
    the claim went while the row said it should be there;
``claim_elsewhere``
    ... with an allocation on another node's provider;
``shared_provider``
    a provider with the allocations of two consumers (never allowed);
``claim_leaked``
    an allocation whose consumer is an ``instance add`` record, a live
    instance without a node in no task that gives the claim back (a failed
    build is ``releasing`` until it did), an instance deleted more than ``claim_grace`` seconds
    ago (the reaper of a node whose instance was deleted while its host
    was down releases the claim after the teardown), or no instance of the
    database for more than ``create_window`` seconds (``instance create``
    claims before it records the row, and gives the claim back when it
    records nothing).

:func:`read` reads Placement; :class:`PlacementAgreement` checks a sample
(:meth:`~PlacementAgreement.check` is pure but for the memory of earlier
samples that the bounds need) and keeps what it found.
"""

import collections
import dataclasses
import threading

import sqlalchemy as sa

from ironic_compute.placement import audit
from tests.functional import agreement

RULES = ('provider_remade', 'provider_missing', 'provider_stale', 'claim_missing',
         'claim_elsewhere', 'shared_provider', 'claim_leaked')
# The tasks in which the managing service may have given the claim back
# while the row still names the node: the audit's rule (one place).
FREEING = audit.FREEING

_providers = sa.table('resource_providers', sa.column('id'), sa.column('uuid'))
_allocations = sa.table('allocations', sa.column('resource_provider_id'),
                        sa.column('consumer_id'))


@dataclasses.dataclass(frozen=True)
class View:
    """Placement, as one read saw it."""

    providers: dict  # {node uuid: provider row id}
    allocations: dict  # {consumer uuid: frozenset(node uuids of its providers)}


def read(conn, watched):
    """The View of the ``watched`` nodes' providers and their allocations."""
    watched = list(watched)
    providers = dict(conn.execute(sa.select(_providers.c.uuid, _providers.c.id).where(
        _providers.c.uuid.in_(watched))).all())
    pairs = conn.execute(
        sa.select(_allocations.c.consumer_id, _providers.c.uuid).distinct()
        .select_from(_allocations.join(
            _providers, _allocations.c.resource_provider_id == _providers.c.id))
        .where(_providers.c.uuid.in_(watched))).all()
    held = collections.defaultdict(set)
    for consumer, node in pairs:
        held[consumer].add(node)
    return View(providers, {c: frozenset(n) for c, n in held.items()})


class PlacementAgreement(agreement.Findings):
    """The rules of the module, sample after sample, and what they found.

    Nothing is checked until :meth:`arm` gives the providers noted at
    start-up. A sample whose Placement read fails counts in ``errors``.
    """

    rules = RULES

    def __init__(self, url, stale_bound, create_window, claim_grace):
        self.engine = sa.create_engine(url)
        self.stale_bound = stale_bound
        self.create_window = create_window
        self.claim_grace = claim_grace
        self.samples = 0
        self.errors = 0
        self.found = collections.defaultdict(list)  # rule -> [(read_at, detail)]
        self._noted = None  # {node: provider row id}, once armed
        self._back_since = {}  # node back in Ironic, its provider not noted yet
        self._gone_since = {}  # node: first read_at Ironic did not have it
        self._unknown_since = {}  # consumer unknown to the database
        self._suspects = {}  # instance -> (read_at, node, detail): claim_missing
        self._lock = threading.Lock()

    def arm(self, providers):
        """Start checking, with ``providers`` ({node: row id}) as noted."""
        with self._lock:
            self._noted = dict(providers)

    def sample(self, read_at, sample):
        """Read Placement after ``sample`` (an agreement.Sample), check, keep."""
        if sample is None or self._noted is None:
            return
        try:
            with self.engine.connect() as conn:
                view = read(conn, sample.nodes.keys() | self._noted.keys()
                            | self._gone_since.keys())
        except sa.exc.SQLAlchemyError:
            with self._lock:
                self.errors += 1
            return
        with self._lock:
            found = self.check(read_at, sample, view)
            self.samples += 1
            for rule, detail in found:
                self.found[rule].append((read_at, detail))

    def check(self, read_at, sample, view):
        """``[(rule, detail)]`` of ``sample`` and ``view`` (see the module);
        remembers what the bounds of later samples need."""
        return (self._providers(read_at, sample.nodes, view.providers)
                + self._claims(read_at, sample, view.allocations))

    def _providers(self, read_at, nodes, providers):
        found = []
        watched = self._noted.keys() | self._gone_since.keys() | nodes.keys()
        for node in sorted(watched):
            row_id = providers.get(node)
            if node not in nodes:
                self._noted.pop(node, None)
                self._back_since.pop(node, None)
                since = self._gone_since.setdefault(node, read_at)
                if row_id is not None and read_at - since > self.stale_bound:
                    found.append(('provider_stale', f'{node}: gone from Ironic for '
                                  f'{read_at - since:.1f} s, provider {row_id} left'))
                continue
            self._gone_since.pop(node, None)
            noted = self._noted.get(node)
            if noted is not None:
                if row_id != noted:
                    found.append(('provider_remade', f'{node}: provider {row_id}, '
                                  f'was {noted}'))
            else:
                # Back in Ironic: the old provider may still go (its owner
                # saw the 404) and a new one come, within the bound.
                since = self._back_since.setdefault(node, read_at)
                if read_at - since <= self.stale_bound:
                    continue
                if row_id is None:
                    found.append(('provider_missing', f'{node}: back in Ironic for '
                                  f'{read_at - since:.1f} s, no provider'))
                else:
                    self._noted[node] = row_id
                    self._back_since.pop(node)
        return found

    def _claims(self, read_at, sample, allocations):
        found = []
        live = {r.uuid: r for r in sample.rows if r.deleted_at is None}
        deleted = {r.uuid: r for r in sample.rows if r.deleted_at is not None}
        found += self._confirm_suspects(live)
        for row in live.values():
            if not row.built_here or row.node is None:
                continue
            held = allocations.get(row.uuid, frozenset())
            if held - {row.node}:
                found.append(('claim_elsewhere', f'{row.uuid} on {row.node}: '
                              f'allocations on {sorted(held)}'))
            elif not held and row.task_state not in FREEING:
                self._suspects[row.uuid] = (read_at, row.node, f'{row.uuid} on {row.node} '
                                            f'({row.vm_state}/{row.task_state}, {row.host}): '
                                            'no allocation')
        by_node = collections.defaultdict(list)
        for consumer, nodes in allocations.items():
            for node in nodes:
                by_node[node].append(consumer)
            found += self._leak(read_at, sample.db_now, consumer, nodes,
                                live.get(consumer), deleted.get(consumer))
        for node, consumers in sorted(by_node.items()):
            if len(consumers) > 1:
                found.append(('shared_provider', f'{node}: {sorted(consumers)}'))
        self._unknown_since = {c: t for c, t in self._unknown_since.items()
                               if c in allocations and c not in live and c not in deleted}
        return found

    def _confirm_suspects(self, live):
        """claim_missing for last sample's suspects still live, on the same
        node, in no freeing task, in this sample's database read."""
        found = []
        suspects, self._suspects = self._suspects, {}
        for uuid, (_seen_at, node, detail) in sorted(suspects.items()):
            row = live.get(uuid)
            if row is not None and row.node == node and row.task_state not in FREEING:
                found.append(('claim_missing', detail))
        return found

    def _leak(self, read_at, db_now, consumer, nodes, row, gone):
        """claim_leaked for one consumer's allocations, if they are."""
        where = f'{consumer} holds {sorted(nodes)}'
        if row is not None:
            if not row.built_here:
                return [('claim_leaked', f'{where}: an instance add record')]
            if row.node is None and row.task_state not in FREEING:
                return [('claim_leaked', f'{where}: live without a node '
                         f'({row.vm_state}/{row.task_state})')]
            return []
        if gone is not None:
            age = (db_now - gone.deleted_at).total_seconds()
            if age > self.claim_grace:
                return [('claim_leaked', f'{where}: deleted {age:.1f} s ago')]
            return []
        since = self._unknown_since.setdefault(consumer, read_at)
        if read_at - since > self.create_window:
            return [('claim_leaked', f'{where}: no instance of the database for '
                     f'{read_at - since:.1f} s')]
        return []

    def close(self):
        self.engine.dispose()
