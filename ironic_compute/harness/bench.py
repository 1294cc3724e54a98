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

"""What the benchmarks in tools/ share: output, errors, databases, fake fleets.

``tox -e bench`` runs them with the project installed, so they import this
module as they import the project.
"""

import argparse
import collections
import contextlib
import dataclasses
import random
import uuid

import sqlalchemy as sa

from ironic_compute import ironic
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import models
from ironic_compute.harness import databases
from ironic_compute.harness import fakes
from ironic_compute.nodes import tracker as resource_tracker

INSERT_CHUNK = 10_000
# A database server the benchmark cannot reach.
Unavailable = databases.DatabaseUnavailable


class BenchError(Exception):
    """Reported as one line; exit 1."""


def say(text=''):
    print(text, flush=True)


def percentile(values, fraction):
    """The nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))]


def host_names(count, domain=''):
    """``compute-000``, ``compute-001``... (with ``.domain`` when given)."""
    return [f'compute-{i:03d}' + (f'.{domain}' if domain else '') for i in range(count)]


def parser(description, quick_sizes, backends):
    """The options every database benchmark has: --quick, --backends, --no-fail."""
    made = argparse.ArgumentParser(description=description)
    made.add_argument('--quick', action='store_true',
                      help=f'only {" and ".join(map(str, quick_sizes))} nodes')
    made.add_argument('--backends', default=','.join(backends),
                      help='comma-separated, of: %(default)s')
    made.add_argument('--no-fail', action='store_true', help='always exit 0')
    return made


def chosen(parser, value, known, what='backends'):
    """The comma-separated names of ``value``; a usage error unless all are ``known``."""
    names = [name.strip() for name in value.split(',') if name.strip()]
    if not names or set(names) - set(known):
        parser.error(f'unknown {what} {sorted(set(names) - set(known))}; known: {known}')
    return names


def open_database(choice):
    """(ProvisionedDatabase, label): PostgreSQL when asked or reachable, else SQLite."""
    try:
        return databases.benchmark_database(choice, say)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from None


def provision(backend):
    """A fresh database on ``backend``; :data:`Unavailable` when its server is not there."""
    return databases.ProvisionedDatabase(backend)


@contextlib.contextmanager
def facade_on(url):
    """The project's enginefacade pointed at ``url`` meanwhile; yields its engine."""
    manager = db_api.facade().make_new_manager()
    manager.configure(connection=url, max_retries=0)
    reset = db_api.facade().patch_factory(manager)
    engine = manager.writer.get_engine()
    try:
        yield engine
    finally:
        reset()
        engine.dispose()


class SqlCounter:
    """Counts what an engine runs: statements, rows written, transactions.

    An executemany is one statement, also when PostgreSQL's driver sends it
    as several batches ("insertmanyvalues").  The explicit BEGIN that oslo.db
    sends on SQLite is not a statement here but a transaction, as on
    PostgreSQL where the driver begins implicitly; SAVEPOINT and RELEASE are
    statements (both backends send them).
    """

    def __init__(self, engine):
        self.keep = False
        self.reset()
        sa.event.listen(engine, 'before_cursor_execute', self._before)
        sa.event.listen(engine, 'after_cursor_execute', self._after)
        sa.event.listen(engine, 'begin', self._begin)

    def reset(self):
        self.statements = self.rows = self.transactions = 0
        self.log = collections.Counter()
        self._last_context = None

    def _before(self, conn, cursor, statement, parameters, context,
                executemany):
        if statement.strip().upper() == 'BEGIN':
            return
        if context is not None and context is self._last_context:
            return  # another batch of the same insertmanyvalues
        self._last_context = context
        self.statements += 1
        if self.keep:
            self.log[' '.join(statement.split())[:150]] += 1

    def _after(self, conn, cursor, statement, parameters, context,
               executemany):
        verb = statement.lstrip()[:6].upper()
        if verb in ('INSERT', 'UPDATE', 'DELETE') and cursor.rowcount > 0:
            self.rows += cursor.rowcount

    def _begin(self, conn):
        self.transactions += 1

    def result(self):
        return (self.statements, self.rows, self.transactions, self.log)


def make_nodes(count, seed=42):
    """Deterministic fake nodes (:mod:`.fakes`) with a little variety in sizes and states."""
    rng = random.Random(seed)
    nodes = []
    for i in range(count):
        node = fakes.make_node(
            uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            cpus=rng.choice((16, 32, 64)),
            memory_mb=rng.choice((65536, 131072, 262144)),
            local_gb=rng.choice((500, 1000)),
            provision_state='available' if rng.random() < 0.7 else 'active',
            capabilities='boot_mode:uefi,raid:1')
        nodes.append(dataclasses.replace(node, name=f'node-{i:06d}'))
    return nodes


def node_fields(nodes):
    """{uuid: the row fields a cycle writes} of ``nodes``."""
    return {n.uuid: resource_tracker.row_fields(n, ironic.node_resources(n))
            for n in nodes}


def populate(engine, service_ids, fields, owner_of, skip_host, ring_kind):
    """Insert the row of every node whose owner is not ``skip_host``."""
    now = models._utcnow()
    rows = [dict(zip(db_nodes.SYNCED_FIELDS, fields[u], strict=True), uuid=u,
                 host=owner, service_id=service_ids[owner],
                 hypervisor_type='ironic', created_at=now, updated_at=now,
                 deleted=0)
            for u, owner in owner_of.items() if owner != skip_host]
    table = models.compute_nodes
    with engine.begin() as conn:
        for start in range(0, len(rows), INSERT_CHUNK):
            conn.execute(table.insert(), rows[start:start + INSERT_CHUNK])
        if ring_kind == 'shard':
            # Every other service runs shard_ring, as recorded by its cycles.
            services = models.services
            conn.execute(services.update().where(services.c.host != skip_host)
                         .values(shard_ring=True))
    return len(owner_of) - len(rows)
