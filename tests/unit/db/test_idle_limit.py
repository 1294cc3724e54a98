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

"""db/idle_limit: a service frozen inside a transaction holds nobody.

The case CI found (tests/functional/test_fencing.py, SIGSTOP on MariaDB): a
service frozen between its heartbeat's UPDATE and its COMMIT holds the lock
of its services row; every peer's takeover of its instances reads that row
in its UPDATE's condition, which on MariaDB waits for the lock, and the
takeover never came. Here the frozen service is a connection of an engine
given the limit, left idle in a transaction that has written its services
row and one of its instances (a worker's write, which PostgreSQL's takeover
waits on as well).
"""

import datetime
import time
import uuid as uuidlib

import pytest
import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import idle_limit
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.db import takeover as db_takeover
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst

LIMIT = 1  # second; MariaDB's unit
# The takeover waits at most for the limit and the server's check of it.
TAKEOVER_BOUND = LIMIT + 9
DOWN_FOR = 10

_services = models.services
_instances = models.instances


def _limited_engine(engine):
    """Another engine on ``engine``'s database, with the limit."""
    limited = sa.create_engine(engine.url)
    idle_limit.limit(limited, LIMIT)
    return limited


def _dead_host_with_an_instance():
    ctx = db_api.Context()
    db_services.register(ctx, 'frozen')
    live_id = db_services.register(ctx, 'live')
    uuid = str(uuidlib.uuid4())
    with db_api.get_engine().begin() as conn:
        conn.execute(_services.update().where(_services.c.host == 'frozen').values(
            last_seen_up=_utcnow() - datetime.timedelta(seconds=DOWN_FOR + 60)))
        conn.execute(_instances.insert().values(
            uuid=uuid, host='frozen', deleted=0, vm_state=inst.BUILDING,
            resource_class='baremetal', generation=0,
            created_at=datetime.datetime(2026, 1, 1)))
    return live_id, uuid


def test_a_frozen_transaction_is_ended_and_the_takeover_goes_on(migrated_engine):
    if migrated_engine.dialect.name == 'sqlite':
        return  # one writer at a time, and no server to end a session
    limited = _limited_engine(migrated_engine)
    live_id, uuid = _dead_host_with_an_instance()
    frozen = limited.connect()
    try:
        transaction = frozen.begin()
        # A heartbeat's write, then a worker's, then nothing: frozen.
        frozen.execute(_services.update().where(_services.c.host == 'frozen')
                       .values(updated_at=_utcnow()))
        frozen.execute(_instances.update().where(_instances.c.uuid == uuid)
                       .values(task_state='spawning'))
        seen = db_takeover.of_hosts(db_api.Context(), ['frozen'])
        started = time.monotonic()
        moved = db_takeover.take_over_many(db_api.Context(), 'frozen', seen, 'live',
                                           live_id, DOWN_FOR)
        waited = time.monotonic() - started
        assert [row.uuid for row in moved] == [uuid]
        assert waited < TAKEOVER_BOUND, waited
        # The frozen service resumes: its transaction is gone, and so are
        # its writes; nothing it does now is committed.
        with pytest.raises(sa.exc.DBAPIError):
            frozen.execute(_instances.update().where(_instances.c.uuid == uuid)
                           .values(task_state='deploying'))
            transaction.commit()
    finally:
        frozen.invalidate()
        frozen.close()
        limited.dispose()
    with migrated_engine.connect() as conn:
        host, task = conn.execute(sa.select(_instances.c.host, _instances.c.task_state)
                                  .where(_instances.c.uuid == uuid)).one()
    assert (host, task) == ('live', None)


def test_every_connection_has_the_limit(migrated_engine):
    limited = _limited_engine(migrated_engine)
    try:
        with limited.connect() as conn:
            if migrated_engine.dialect.name == 'sqlite':
                assert idle_limit.configured(conn) is None
                return
            assert idle_limit.configured(conn) == LIMIT
            if migrated_engine.dialect.name == 'postgresql':
                shown = conn.exec_driver_sql('SHOW idle_in_transaction_session_timeout')
                assert shown.scalar() == f'{LIMIT}s'
            else:
                shown = conn.exec_driver_sql('SELECT @@SESSION.idle_transaction_timeout')
                assert shown.scalar() == LIMIT
    finally:
        limited.dispose()
