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

"""The tables of the shared database (SQLAlchemy Core).

Plain tables on one MetaData, without the ORM: every query is a Core
statement, and a command of ironic-compute-manage does not pay the ORM's
import at start-up (doc/cli.md, "Start-up").

Rows are soft-deleted: ``deleted`` is 0 while a row is live and is set to
the row's id when it is deleted, so a unique constraint over
``(uuid, deleted)`` allows one live row per uuid and any number of deleted
ones, and a returning Ironic node can get its old row back.

Host names are stored normalised (lower case) so that every comparison in
SQL is a plain equality and uses the indexes.
"""

import datetime

import sqlalchemy as sa
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

metadata = sa.MetaData()


def _count(name):
    """A non-negative quantity: NOT NULL, 0 by default."""
    return sa.Column(name, sa.Integer, default=0, server_default='0',
                     nullable=False)


def _flag(name):
    """A boolean, false by default."""
    return sa.Column(name, sa.Boolean, default=False,
                     server_default=sa.false(), nullable=False)


def _name(name):
    """An optional short string (host, state, key...)."""
    return sa.Column(name, sa.String(255))


def _timestamps():
    """When the row was made, last changed and soft-deleted, and
    ``deleted`` (0 while live, else the row's id)."""
    return (sa.Column('created_at', Timestamp, default=_utcnow,
                      nullable=False),
            sa.Column('updated_at', Timestamp, onupdate=_utcnow),
            sa.Column('deleted_at', Timestamp),
            _count('deleted'))


def _hosted_record(table):
    """A record of an Ironic object, by uuid, managed by one host: its
    columns, one live row per uuid, and an index to load a host's own
    rows."""
    return (sa.Column('id', sa.Integer, primary_key=True),
            sa.Column('uuid', sa.String(36), nullable=False),
            _name('host'),
            *_timestamps(),
            sa.UniqueConstraint('uuid', 'deleted',
                                name=f'uniq_{table}0uuid0deleted'),
            sa.Index(f'{table}_host_deleted_idx', 'host', 'deleted'))


# One ironic-compute process, identified by (host, binary).
services = sa.Table(
    'services', metadata,
    sa.Column('id', sa.Integer, primary_key=True),
    sa.Column('host', sa.String(255), nullable=False),
    sa.Column('binary', sa.String(255), nullable=False),
    _name('topic'),
    _count('report_count'),
    _flag('disabled'),
    _name('disabled_reason'),
    _flag('forced_down'),
    sa.Column('last_seen_up', Timestamp),
    # Set when the service leaves cleanly, so peers take its nodes at once
    # instead of waiting service_down_time; cleared when it starts again.
    sa.Column('stopped_at', Timestamp),
    sa.Column('last_cycle_at', Timestamp),
    sa.Column('last_cycle_seconds', sa.Float),
    # The conductor group the service manages (None: all nodes), refreshed
    # at every cycle so that a SIGHUP change reaches the peers.
    _name('partition_key'),
    # The Ironic shard it manages (None: any), part of its partition too.
    _name('shard'),
    # JSON: the settings that shape its ring (agreement.ring_settings),
    # refreshed at every cycle (migration 0006).
    sa.Column('ring_settings', sa.Text),
    # Whether it runs [ironic]shard_ring (a shard peer), refreshed at every
    # cycle (migration 0007).
    _flag('shard_ring'),
    *_timestamps(),
    sa.UniqueConstraint('host', 'binary', 'deleted',
                        name='uniq_services0host0binary0deleted'),
    # Loading the peers each cycle filters by binary.
    sa.Index('services_binary_deleted_idx', 'binary', 'deleted'),
)

# One Ironic node as capacity for the scheduler, owned by one host.
compute_nodes = sa.Table(
    'compute_nodes', metadata,
    sa.Column('service_id', sa.Integer, sa.ForeignKey('services.id')),
    sa.Column('hypervisor_type', sa.String(255), default='ironic',
              server_default='ironic', nullable=False),
    _name('hypervisor_hostname'),
    _name('conductor_group'),
    # The node's Ironic shard (None: unsharded), migration 0007.
    _name('shard'),
    _count('vcpus'),
    _count('memory_mb'),
    _count('local_gb'),
    _count('vcpus_used'),
    _count('memory_mb_used'),
    _count('local_gb_used'),
    sa.Column('cpu_arch', sa.String(32)),
    sa.Column('cpu_info', sa.Text),
    # Compared exactly by the scheduler: on MariaDB/MySQL the binary
    # collation (migration 0011; a utf8mb3 table gets utf8mb3_bin).
    sa.Column('resource_class', sa.String(255).with_variant(
        mysql.VARCHAR(255, collation=EXACT_COLLATION), 'mysql', 'mariadb')),
    # JSON: capabilities, provision state and other per-node facts.
    sa.Column('stats', sa.Text),
    # What the scheduler matches in SQL, synced with the other fields
    # (migration 0010): whether Ironic has the node free, and its traits
    # as '|A|B|' (see compute_nodes.traits_text), compared exactly as the
    # resource class.
    _flag('available'),
    sa.Column('traits', sa.Text().with_variant(
        mysql.TEXT(collation=EXACT_COLLATION), 'mysql', 'mariadb')),
    # Its capabilities as '|key:value|...|' (compute_nodes.
    # capabilities_text), matched exactly as the traits (migration 0013).
    sa.Column('capabilities', sa.Text().with_variant(
        mysql.TEXT(collation=EXACT_COLLATION), 'mysql', 'mariadb')),
    *_hosted_record('compute_nodes'),
    # A service loads its own rows (host), and the peers that own any row.
    sa.Index('compute_nodes_service_id_idx', 'service_id'),
    # With shard_ring a service reads the rows of its shards only.
    sa.Index('compute_nodes_group_shard_deleted_idx', 'conductor_group',
             'shard', 'deleted'),
    # The scheduler reads a few free nodes of each host (migration 0010).
    sa.Index('compute_nodes_host_rc_available_idx', 'host',
             'resource_class', 'available', 'deleted'),
)

# An instance placed on an Ironic node, managed by one host.
instances = sa.Table(
    'instances', metadata,
    sa.Column('node', sa.String(36)),
    _name('vm_state'),
    _name('task_state'),
    # The build request (migration 0005). NULL on records made by
    # ``instance add``, which describe an instance built elsewhere.
    _name('name'),
    # The conductor group asked for (NULL: any); scheduling and takeover
    # stay within it.
    _name('partition_key'),
    # What the node must have: its resource class, these traits (a JSON
    # list) and at least this capacity.
    _name('resource_class'),
    sa.Column('traits', sa.Text),
    _count('vcpus'),
    _count('memory_mb'),
    _count('disk_gb'),
    sa.Column('image_source', sa.Text),
    # One line: why the instance is in error.
    sa.Column('fault', sa.Text),
    sa.Column('launched_at', Timestamp),
    # Bumped by every change of host (takeover, node move): the fencing
    # token a worker's writes and Ironic calls are conditional on (0008).
    _count('generation'),
    # What Ironic last said of the node's power: on, off, unknown (0009).
    sa.Column('power_state', sa.String(16)),
    # The action in task_state: its arguments and the progress a worker
    # recorded (JSON), and since when it waits (0009).
    # LONGTEXT on MariaDB (0014): a rebuild's new user data waits here.
    sa.Column('task_args', LongText),
    sa.Column('task_requested_at', Timestamp),
    # Bumped by every write of the row: an observer's write (the power-state
    # sync) is conditional on the version it read, not on values (0012).
    _count('version'),
    # The rest of the request (migration 0013): the node capabilities it
    # must have (a JSON object), the partitions beside the root, what
    # Ironic needs of the image, and the tenant (the node's lessee while
    # the instance lives).
    sa.Column('capabilities', sa.Text),
    _count('ephemeral_gb'),
    _name('ephemeral_format'),
    _count('swap_mb'),
    sa.Column('image_checksum', sa.Text),
    sa.Column('image_kernel', sa.Text),
    sa.Column('image_ramdisk', sa.Text),
    _name('project_id'),
    _name('user_id'),
    # The config drive (migration 0014): what the deploy and every rebuild
    # give Ironic to build it from. user_data is a secret of the tenant's.
    sa.Column('ssh_keys', sa.Text),  # JSON
    sa.Column('user_data', LongText),
    sa.Column('meta', sa.Text),  # JSON
    sa.Column('network_data', LongText),
    _name('hostname'),
    *_hosted_record('instances'),
    # One live instance per node (migration 0008); NULL nodes (builds
    # without a node yet) never collide.
    sa.UniqueConstraint('node', 'deleted', name='uniq_instances0node0deleted'),
    sa.Index('instances_host_task_state_idx', 'host', 'task_state',
             'deleted'),
    # instance list --project (migration 0013).
    sa.Index('instances_project_id_deleted_idx', 'project_id', 'deleted'),
)

# Rows that exist to be locked (migration 0010). A writer serialises with
# the others by updating its row first in its transaction: an UPDATE, which
# a Galera cluster certifies, unlike a ``SELECT ... FOR UPDATE``. Nothing
# else writes these rows.
locks = sa.Table(
    'locks', metadata,
    sa.Column('name', sa.String(255), primary_key=True),
    # Bumped by every holder: how many times it was taken.
    sa.Column('generation', sa.BigInteger, default=0, server_default='0',
              nullable=False),
    sa.Column('updated_at', Timestamp),
)
