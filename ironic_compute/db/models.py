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

"""SQLAlchemy models of the shared database.

Rows are soft-deleted: ``deleted`` is 0 while a row is live and is set to
the row's id when it is deleted, so a unique constraint over
``(uuid, deleted)`` allows one live row per uuid and any number of deleted
ones, and a returning Ironic node can get its old row back.

Host names are stored normalised (lower case) so that every comparison in
SQL is a plain equality and uses the indexes.
"""

import datetime

import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.dialects import mysql

# How far this process's clock is off; zero, but a test may set it (see
# tests/functional/hooked_compute.py) to show that liveness never depends on
# a host's clock (it is the database's).
CLOCK_OFFSET = datetime.timedelta(0)


def _utcnow():
    return (datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            + CLOCK_OFFSET)


# Microseconds on every backend: a plain DATETIME on MariaDB/MySQL keeps whole
# seconds, and a heartbeat would look up to a second older than it is
# (migration 0004).
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mysql',
                                       'mariadb')

# Text as large as Ironic takes a config drive (64 MiB): MariaDB's TEXT
# stops at 64 KiB (migration 0014).
LongText = sa.Text().with_variant(mysql.LONGTEXT(), 'mysql', 'mariadb')

# The collation of the columns the scheduler matches on MariaDB/MySQL: exact,
# as Python and PostgreSQL compare (the default ignores case).
EXACT_COLLATION = 'utf8mb4_bin'


class Base(orm.DeclarativeBase):
    pass


def _count():
    """A non-negative quantity: NOT NULL, 0 by default."""
    return orm.mapped_column(sa.Integer, default=0, server_default='0',
                             nullable=False)


def _uuid_unique_while_live(table):
    """One live row per uuid (soft-deleted rows keep their id in ``deleted``)."""
    return sa.UniqueConstraint('uuid', 'deleted', name=f'uniq_{table}0uuid0deleted')


def _name():
    """An optional short string (host, state, key...)."""
    return orm.mapped_column(sa.String(255))


class _Timestamps:
    created_at: orm.Mapped[datetime.datetime] = orm.mapped_column(
        Timestamp, default=_utcnow, nullable=False)
    updated_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        Timestamp, onupdate=_utcnow)
    deleted_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        Timestamp)
    deleted: orm.Mapped[int] = _count()


class _HostedRecord(_Timestamps):
    """A record of an Ironic object, by uuid, managed by one host."""

    id: orm.Mapped[int] = orm.mapped_column(sa.Integer, primary_key=True)
    uuid: orm.Mapped[str] = orm.mapped_column(sa.String(36), nullable=False)
    host: orm.Mapped[str | None] = _name()


def _hosted_table_args(table, *indexes):
    """One live row per uuid, and an index to load a host's own rows."""
    return (_uuid_unique_while_live(table),
            sa.Index(f'{table}_host_deleted_idx', 'host', 'deleted'),
            *indexes)


class Service(_Timestamps, Base):
    """One ironic-compute process, identified by (host, binary)."""

    __tablename__ = 'services'
    __table_args__ = (
        sa.UniqueConstraint('host', 'binary', 'deleted',
                            name='uniq_services0host0binary0deleted'),
        # Loading the peers each cycle filters by binary.
        sa.Index('services_binary_deleted_idx', 'binary', 'deleted'),
    )

    id: orm.Mapped[int] = orm.mapped_column(sa.Integer, primary_key=True)
    host: orm.Mapped[str] = orm.mapped_column(sa.String(255), nullable=False)
    binary: orm.Mapped[str] = orm.mapped_column(sa.String(255),
                                                nullable=False)
    topic: orm.Mapped[str | None] = _name()
    report_count: orm.Mapped[int] = _count()
    disabled: orm.Mapped[bool] = orm.mapped_column(
        sa.Boolean, default=False, server_default=sa.false(), nullable=False)
    disabled_reason: orm.Mapped[str | None] = _name()
    forced_down: orm.Mapped[bool] = orm.mapped_column(
        sa.Boolean, default=False, server_default=sa.false(), nullable=False)
    last_seen_up: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        Timestamp)
    # Set when the service leaves cleanly, so peers take its nodes at once
    # instead of waiting service_down_time; cleared when it starts again.
    stopped_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        Timestamp)
    last_cycle_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        Timestamp)
    last_cycle_seconds: orm.Mapped[float | None] = orm.mapped_column(
        sa.Float)
    # The conductor group the service manages (None: all nodes), refreshed
    # at every cycle so that a SIGHUP change reaches the peers.
    partition_key: orm.Mapped[str | None] = _name()
    # The Ironic shard it manages (None: any), part of its partition too.
    shard: orm.Mapped[str | None] = _name()
    # JSON: the settings that shape its ring (agreement.ring_settings),
    # refreshed at every cycle (migration 0006).
    ring_settings: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    # Whether it runs [ironic]shard_ring (a shard peer), refreshed at every
    # cycle (migration 0007).
    shard_ring: orm.Mapped[bool] = orm.mapped_column(
        sa.Boolean, default=False, server_default=sa.false(), nullable=False)


class ComputeNode(_HostedRecord, Base):
    """One Ironic node as capacity for the scheduler, owned by one host."""

    __tablename__ = 'compute_nodes'
    # A service loads its own rows (host), and the peers that own any row.
    __table_args__ = _hosted_table_args(
        'compute_nodes',
        sa.Index('compute_nodes_service_id_idx', 'service_id'),
        # With shard_ring a service reads the rows of its shards only.
        sa.Index('compute_nodes_group_shard_deleted_idx', 'conductor_group',
                 'shard', 'deleted'),
        # The scheduler reads a few free nodes of each host (migration 0010).
        sa.Index('compute_nodes_host_rc_available_idx', 'host',
                 'resource_class', 'available', 'deleted'),
    )

    service_id: orm.Mapped[int | None] = orm.mapped_column(
        sa.Integer, sa.ForeignKey('services.id'))
    hypervisor_type: orm.Mapped[str] = orm.mapped_column(
        sa.String(255), default='ironic', server_default='ironic',
        nullable=False)
    hypervisor_hostname: orm.Mapped[str | None] = _name()
    conductor_group: orm.Mapped[str | None] = _name()
    # The node's Ironic shard (None: unsharded), migration 0007.
    shard: orm.Mapped[str | None] = _name()
    vcpus: orm.Mapped[int] = _count()
    memory_mb: orm.Mapped[int] = _count()
    local_gb: orm.Mapped[int] = _count()
    vcpus_used: orm.Mapped[int] = _count()
    memory_mb_used: orm.Mapped[int] = _count()
    local_gb_used: orm.Mapped[int] = _count()
    cpu_arch: orm.Mapped[str | None] = orm.mapped_column(sa.String(32))
    cpu_info: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    # Compared exactly by the scheduler: on MariaDB/MySQL the binary
    # collation (migration 0011; a utf8mb3 table gets utf8mb3_bin).
    resource_class: orm.Mapped[str | None] = orm.mapped_column(
        sa.String(255).with_variant(
            mysql.VARCHAR(255, collation=EXACT_COLLATION), 'mysql', 'mariadb'))
    # JSON: capabilities, provision state and other per-node facts.
    stats: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    # What the scheduler matches in SQL, synced with the other fields
    # (migration 0010): whether Ironic has the node free, and its traits
    # as '|A|B|' (see compute_nodes.traits_text), compared exactly as the
    # resource class.
    available: orm.Mapped[bool] = orm.mapped_column(
        sa.Boolean, default=False, server_default=sa.false(), nullable=False)
    traits: orm.Mapped[str | None] = orm.mapped_column(
        sa.Text().with_variant(mysql.TEXT(collation=EXACT_COLLATION), 'mysql',
                               'mariadb'))
    # Its capabilities as '|key:value|...|' (compute_nodes.
    # capabilities_text), matched exactly as the traits (migration 0013).
    capabilities: orm.Mapped[str | None] = orm.mapped_column(
        sa.Text().with_variant(mysql.TEXT(collation=EXACT_COLLATION), 'mysql',
                               'mariadb'))


class Instance(_HostedRecord, Base):
    """An instance placed on an Ironic node, managed by one host."""

    __tablename__ = 'instances'
    __table_args__ = _hosted_table_args(
        'instances',
        # One live instance per node (migration 0008); NULL nodes (builds
        # without a node yet) never collide.
        sa.UniqueConstraint('node', 'deleted',
                            name='uniq_instances0node0deleted'),
        sa.Index('instances_host_task_state_idx', 'host', 'task_state',
                 'deleted'),
        # instance list --project (migration 0013).
        sa.Index('instances_project_id_deleted_idx', 'project_id',
                 'deleted'),
    )

    node: orm.Mapped[str | None] = orm.mapped_column(sa.String(36))
    vm_state: orm.Mapped[str | None] = _name()
    task_state: orm.Mapped[str | None] = _name()
    # The build request (migration 0005). NULL on records made by
    # ``instance add``, which describe an instance built elsewhere.
    name: orm.Mapped[str | None] = _name()
    # The conductor group asked for (NULL: any); scheduling and takeover
    # stay within it.
    partition_key: orm.Mapped[str | None] = _name()
    # What the node must have: its resource class, these traits (a JSON
    # list) and at least this capacity.
    resource_class: orm.Mapped[str | None] = _name()
    traits: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    vcpus: orm.Mapped[int] = _count()
    memory_mb: orm.Mapped[int] = _count()
    disk_gb: orm.Mapped[int] = _count()
    image_source: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    # One line: why the instance is in error.
    fault: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    launched_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        Timestamp)
    # Bumped by every change of host (takeover, node move): the fencing
    # token a worker's writes and Ironic calls are conditional on (0008).
    generation: orm.Mapped[int] = _count()
    # What Ironic last said of the node's power: on, off, unknown (0009).
    power_state: orm.Mapped[str | None] = orm.mapped_column(sa.String(16))
    # The action in task_state: its arguments and the progress a worker
    # recorded (JSON), and since when it waits (0009).
    # LONGTEXT on MariaDB (0014): a rebuild's new user data waits here.
    task_args: orm.Mapped[str | None] = orm.mapped_column(LongText)
    task_requested_at: orm.Mapped[datetime.datetime | None] = (
        orm.mapped_column(Timestamp))
    # Bumped by every write of the row: an observer's write (the power-state
    # sync) is conditional on the version it read, not on values (0012).
    version: orm.Mapped[int] = _count()
    # The rest of the request (migration 0013): the node capabilities it
    # must have (a JSON object), the partitions beside the root, what
    # Ironic needs of the image, and the tenant (the node's lessee while
    # the instance lives).
    capabilities: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    ephemeral_gb: orm.Mapped[int] = _count()
    ephemeral_format: orm.Mapped[str | None] = _name()
    swap_mb: orm.Mapped[int] = _count()
    image_checksum: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    image_kernel: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    image_ramdisk: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    project_id: orm.Mapped[str | None] = _name()
    user_id: orm.Mapped[str | None] = _name()
    # The config drive (migration 0014): what the deploy and every rebuild
    # give Ironic to build it from. user_data is a secret of the tenant's.
    ssh_keys: orm.Mapped[str | None] = orm.mapped_column(sa.Text)  # JSON
    user_data: orm.Mapped[str | None] = orm.mapped_column(LongText)
    meta: orm.Mapped[str | None] = orm.mapped_column(sa.Text)  # JSON
    network_data: orm.Mapped[str | None] = orm.mapped_column(LongText)
    hostname: orm.Mapped[str | None] = _name()


class Lock(Base):
    """A row that exists to be locked (migration 0010).

    A writer serialises with the others by updating its row first in its
    transaction: an UPDATE, which a Galera cluster certifies, unlike a
    ``SELECT ... FOR UPDATE``. Nothing else writes these rows.
    """

    __tablename__ = 'locks'

    name: orm.Mapped[str] = orm.mapped_column(sa.String(255),
                                              primary_key=True)
    # Bumped by every holder: how many times it was taken.
    generation: orm.Mapped[int] = orm.mapped_column(
        sa.BigInteger, default=0, server_default='0', nullable=False)
    updated_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        Timestamp)
