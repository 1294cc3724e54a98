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

"""The providers of the nodes this service owns, kept as provider.py says.

The resource tracker calls :meth:`ProviderSync.run` once per cycle, after
its rows are written, with the nodes whose rows this service holds: only
the owner of a node's row writes its provider. What it does:

- A provider it has not seen since it started (a restart, a takeover, a node
  that is new to Placement) is read (inventory, traits, aggregates: three
  GETs), or created when Placement answers 404. A 409 on the create (the
  uuid or the name exists: another service made it meanwhile) means read it
  and adopt it. A provider is never deleted or re-created because a node
  changed owner.
- Then only what differs is written, each write naming the generation last
  seen; a 409 generation conflict means read again and retry, at most
  ``MAX_ATTEMPTS`` times.
- It remembers, per provider, the generation and the state it last wrote or
  read, and what of it is its own. A steady cycle (no node changed) sends no
  request at all, except one listing of the providers of its conductor
  groups' aggregates every ``[placement]refresh_interval`` seconds, which
  finds the providers someone else changed or deleted (their generation
  moved): those are read again and set right.
- Traits and aggregates are told apart by who set them: this service sets
  the node's traits, ``COMPUTE_NODE`` and its conductor group's aggregate;
  any other trait or aggregate on the provider (an operator's) is kept. On
  first sight "what this service set before" is what the node's row last
  recorded (its traits and conductor group, as synced by the previous
  owner), so a trait removed from the node in Ironic during a takeover
  still goes.
- A provider is deleted only for a node whose row was deleted after Ironic
  answered 404, and only once no allocation is left on it; until then it
  is retried every cycle (logged).
- Placement down or answering 5xx stops this pass for the cycle (one log
  line); the rows are already written, and the next cycle tries again.
"""

import dataclasses
import threading
import time
from concurrent import futures

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute import outage
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import provider

LOG = logging.getLogger(__name__)

# Attempts to write one provider when its generation keeps changing.
MAX_ATTEMPTS = 3
# Providers read or written at once when many need it (a first sync):
# Placement, not the round trips of one thread, then bounds its time.
WORKERS = 4

_EMPTY = provider.State({}, frozenset(), frozenset())


@dataclasses.dataclass
class Known:
    """One provider as this service last saw it."""

    generation: int
    state: provider.State  # the whole provider after our last read or write
    managed: provider.State  # the part of it that is this service's


@dataclasses.dataclass
class SyncStats:
    created: int = 0
    adopted: int = 0  # providers that existed (restart, takeover, 409)
    updated: int = 0  # providers written to
    deleted: int = 0
    kept: int = 0  # providers of gone nodes kept for their allocations
    conflicts: int = 0  # generation conflicts (each re-read)
    failed: int = 0  # providers not brought up to date this cycle
    requests: int = 0
    skipped: str | None = None

    @property
    def changed(self):
        return bool(self.created or self.adopted or self.updated
                    or self.deleted or self.failed or self.skipped)


class _CountingClient:
    """The client, counting the requests of a run."""

    def __init__(self, client, stats):
        self._client, self._stats = client, stats

    def __getattr__(self, name):
        func = getattr(self._client, name)

        def call(*args, **kwargs):
            self._stats.requests += 1
            return func(*args, **kwargs)
        return call


def row_account(conductor_group, traits_text):
    """What the previous writer of a provider set, from the node's row: its
    traits column ('|A|B|') and conductor group."""
    traits = frozenset(t for t in (traits_text or '').split('|') if t)
    return provider.State({}, traits | provider.SERVICE_TRAITS,
                          frozenset({provider.aggregate_uuid(conductor_group)}))


class ProviderSync:
    """The providers of this service's nodes (see the module docstring)."""

    def __init__(self, client, refresh_interval=300, budget=300,
                 clock=time.monotonic, workers=WORKERS):
        self.client = client
        self.workers = workers
        self.refresh_interval = refresh_interval
        self.budget = budget  # seconds of one run; the rest waits a cycle
        self.clock = clock
        self.known = {}  # uuid -> Known
        # uuid -> provider.State: what this service set on the provider,
        # kept while the provider is read again (a conflict, the refresh).
        self.managed = {}
        self.doomed = {}  # uuid -> True once its kept allocation was logged
        self._custom = set()  # custom classes and traits known to exist
        self._refreshed_at = None
        self.outage = outage.Outage('Placement')

    @classmethod
    def from_conf(cls, conf):
        """A ProviderSync for ``conf``, or None when [placement] is not
        configured (then nothing is ever sent)."""
        if not placement_client.configured(conf):
            return None
        return cls(placement_client.PlacementClient(conf),
                   refresh_interval=conf.placement.refresh_interval,
                   budget=conf.loop_stuck_timeout / 3)

    def run(self, nodes, gone=(), before=None, fresh=None):
        """Bring the providers of ``nodes`` ({uuid: ironic.Node}: the nodes
        whose rows this service holds) up to date, and delete those of
        ``gone`` (uuids of rows deleted after Ironic's 404) once no
        allocation is left; return SyncStats. Never raises for Placement.

        ``before``: {uuid: provider.State}, what the previous writer of a
        provider set (row_account), for the providers not seen yet.
        ``fresh``: a callable saying whether the cycle's view of its peers
        is still fresh enough to act on (the tracker's fence): once it says
        no, no other provider is written; the rest waits for the next cycle.
        """
        stats = SyncStats()
        client = _CountingClient(self.client, stats)
        for uuid in self.known.keys() - nodes.keys():
            del self.known[uuid]  # no longer ours: read again if it returns
        for uuid in self.managed.keys() - nodes.keys():
            del self.managed[uuid]
        for uuid in gone:
            self.doomed.setdefault(uuid, False)
        started = self.clock()
        try:
            self._refresh(client, nodes)
            self._delete_doomed(client, nodes, stats)
            todo = []
            for uuid, node in nodes.items():
                ours = provider.desired(node)
                known = self.known.get(uuid)
                if known is None or known.managed != ours:
                    todo.append((uuid, ours, known, (before or {}).get(uuid)))
            # Providers not seen yet: one listing of their groups tells
            # which exist, so that a new one costs no 404 first.
            unseen = [item for item in todo if item[2] is None]
            listed = None
            if len(unseen) > 1:
                listed = client.list_providers(member_of=set().union(
                    *(ours.aggregates for _u, ours, _k, _b in unseen)))
            self._sync_all(todo, stats, started, listed, fresh)
        except exception.PlacementUnavailable as exc:
            stats.skipped = f'Placement unavailable {self.outage.failed(exc)}'
            LOG.error('Placement not updated this cycle (the rows are): %s',
                      stats.skipped)
            return stats
        self.outage.ended(LOG)
        if stats.changed:
            LOG.info('Placement: created=%(created)d adopted=%(adopted)d '
                     'updated=%(updated)d deleted=%(deleted)d kept=%(kept)d '
                     'conflicts=%(conflicts)d failed=%(failed)d '
                     'requests=%(requests)d', dataclasses.asdict(stats))
        return stats

    def _sync_all(self, todo, stats, started, listed=None, fresh=None):
        """_sync_one for each of ``todo``, ``workers`` at a time (a first
        sync is then bounded by Placement's rate, not by round trips), until
        ``budget`` seconds have passed since ``started``. ``listed``: the
        uuids of the providers known to exist (None: unknown)."""
        halt = threading.Event()

        def one(uuid, ours, known, before):
            mine = SyncStats()
            if halt.is_set():
                return mine
            if self.clock() - started > self.budget:
                mine.skipped = (f'{self.budget:.0f} s spent; the other '
                                'providers next cycle')
                return mine
            if fresh is not None and not fresh():
                mine.skipped = ('the view of the peers is too old to act on; '
                                'the other providers next cycle')
                return mine
            try:
                self._sync_one(_CountingClient(self.client, mine), uuid,
                               ours, known, before, mine,
                               absent=listed is not None and uuid not in listed)
            except exception.PlacementUnavailable:
                halt.set()  # the others stop at their next provider
                raise
            return mine

        if self.workers <= 1 or len(todo) < 2 * self.workers:
            results = [one(*item) for item in todo]
        else:
            with futures.ThreadPoolExecutor(self.workers) as pool:
                results = list(pool.map(lambda item: one(*item), todo))
        for mine in results:
            for field in dataclasses.fields(SyncStats):
                if field.name == 'skipped':
                    stats.skipped = stats.skipped or mine.skipped
                else:
                    setattr(stats, field.name, getattr(stats, field.name)
                            + getattr(mine, field.name))

    # -- the steady cycle's one read

    def _refresh(self, client, nodes):
        """Every refresh_interval: one listing of the providers of our
        conductor groups' aggregates; forget the providers whose generation
        moved or that are gone, so that they are read again."""
        now = self.clock()
        if self._refreshed_at is None or not self.known:
            self._refreshed_at = now  # everything is read on first sight
            return
        if (self.refresh_interval <= 0
                or now - self._refreshed_at < self.refresh_interval):
            return
        self._refreshed_at = now
        aggregates = {provider.aggregate_uuid(n.conductor_group)
                      for n in nodes.values()}
        listed = client.list_providers(member_of=aggregates)
        for uuid, known in list(self.known.items()):
            if listed.get(uuid) != known.generation:
                LOG.info('Provider %s changed outside this service (or was '
                         'deleted): reading it again', uuid)
                del self.known[uuid]

    # -- one provider

    def _sync_one(self, client, uuid, ours, known, before, stats,
                  absent=False):
        for _attempt in range(MAX_ATTEMPTS):
            try:
                if known is None:
                    known = self._read(client, uuid, ours, before, stats,
                                       absent)
                    absent = False
                self._write(client, uuid, ours, known, stats)
                return
            except exception.PlacementConflict as exc:
                if not exc.generation_changed:
                    LOG.warning('Provider %s not updated: %s', uuid, exc)
                    break
                stats.conflicts += 1
                known = None  # someone else wrote: read again
            except (exception.PlacementRefused,
                    exception.PlacementNotFound) as exc:
                LOG.warning('Provider %s not updated: %s', uuid, exc)
                break
        else:
            LOG.warning('Provider %s not updated: its generation changed '
                        'at each of %d attempts; next cycle', uuid,
                        MAX_ATTEMPTS)
        stats.failed += 1
        self.known.pop(uuid, None)

    def _read(self, client, uuid, ours, before, stats, absent=False):
        """Known for ``uuid``, read from Placement; created when absent
        (``absent``: a listing said so, create it without asking)."""
        managed = self.managed.get(uuid) or before or ours
        try:
            if absent:
                raise exception.PlacementNotFound('not listed')
            generation, inventory = client.get_inventories(uuid)
        except exception.PlacementNotFound:
            try:
                generation = client.create_provider(uuid, uuid)
            except exception.PlacementConflict as exc:
                # Created meanwhile by another service: adopt it.
                LOG.info('Provider %s exists already (%s): adopting it',
                         uuid, exc.code)
                generation, inventory = client.get_inventories(uuid)
            else:
                stats.created += 1
                return Known(generation, _EMPTY, managed)
        traits_generation, traits = client.get_traits(uuid)
        aggregates_generation, aggregates = client.get_aggregates(uuid)
        if not generation == traits_generation == aggregates_generation:
            raise exception.PlacementConflict(
                f'provider {uuid} changed while read',
                code='placement.concurrent_update')
        stats.adopted += 1
        return Known(generation, provider.State(inventory, traits, aggregates),
                     managed)

    def _write(self, client, uuid, ours, known, stats):
        """Write what differs between the provider and what it should
        hold; remember the result."""
        target = provider.merged(ours, known.state, known.managed)
        self._ensure_custom(client, ours)
        generation, state = known.generation, known.state
        writes = 0
        if target.inventory != state.inventory:
            generation = client.put_inventories(uuid, generation,
                                                target.inventory)
            state = dataclasses.replace(state, inventory=target.inventory)
            writes += 1
        if target.traits != state.traits:
            generation = client.put_traits(uuid, generation, target.traits)
            state = dataclasses.replace(state, traits=target.traits)
            writes += 1
        if target.aggregates != state.aggregates:
            generation = client.put_aggregates(uuid, generation,
                                               target.aggregates)
            state = dataclasses.replace(state, aggregates=target.aggregates)
            writes += 1
        stats.updated += bool(writes)
        self.known[uuid] = Known(generation, state, ours)
        self.managed[uuid] = ours

    def _ensure_custom(self, client, state):
        ensure_custom(client, state, self._custom)

    # -- providers of gone nodes

    def _delete_doomed(self, client, nodes, stats):
        delete_doomed(self, client, nodes, stats)


def ensure_custom(client, state, known):
    """PUT the custom resource classes and traits of ``state`` that are not
    in ``known`` (the names known to exist), and add them to it."""
    classes, traits = provider.custom_names(state)
    for name in sorted(classes - known):
        client.ensure_resource_class(name)
        known.add(name)
    for name in sorted(traits - known):
        client.ensure_trait(name)
        known.add(name)


def delete_doomed(sync, client, nodes, stats):
    """Delete the providers of ``sync.doomed`` (gone nodes) that have no
    allocation left; keep (and log once) the others."""
    for uuid, logged in list(sync.doomed.items()):
        if uuid in nodes:  # the node is back, and ours
            del sync.doomed[uuid]
            continue
        try:
            allocations = client.provider_allocations(uuid)
            if not allocations:
                client.delete_provider(uuid)
        except exception.PlacementNotFound:
            allocations = None  # gone already
        except exception.PlacementConflict:
            allocations = True  # an allocation came meanwhile
        if allocations:
            stats.kept += 1
            if not logged:
                LOG.warning('Node %s is gone from Ironic but its provider '
                            'still has allocations (%s): it is deleted '
                            'once they are', uuid,
                            ', '.join(sorted(allocations))
                            if isinstance(allocations, dict) else 'new')
                sync.doomed[uuid] = True
            continue
        del sync.doomed[uuid]
        sync.known.pop(uuid, None)
        sync.managed.pop(uuid, None)
        if allocations is not None:
            stats.deleted += 1
            LOG.info('Node %s is gone from Ironic: provider deleted', uuid)
