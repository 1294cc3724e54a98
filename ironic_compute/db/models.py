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


def _utcnow():
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


class Base(orm.DeclarativeBase):
    pass


class _Timestamps:
    created_at: orm.Mapped[datetime.datetime] = orm.mapped_column(
        sa.DateTime, default=_utcnow, nullable=False)
    updated_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        sa.DateTime, onupdate=_utcnow)
    deleted_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        sa.DateTime)
    deleted: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)


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
    topic: orm.Mapped[str | None] = orm.mapped_column(sa.String(255))
    report_count: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)
    disabled: orm.Mapped[bool] = orm.mapped_column(
        sa.Boolean, default=False, server_default=sa.false(), nullable=False)
    disabled_reason: orm.Mapped[str | None] = orm.mapped_column(
        sa.String(255))
    forced_down: orm.Mapped[bool] = orm.mapped_column(
        sa.Boolean, default=False, server_default=sa.false(), nullable=False)
    last_seen_up: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        sa.DateTime)
    # Set when the service leaves cleanly, so peers take its nodes at once
    # instead of waiting service_down_time; cleared when it starts again.
    stopped_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        sa.DateTime)
    last_cycle_at: orm.Mapped[datetime.datetime | None] = orm.mapped_column(
        sa.DateTime)
    last_cycle_seconds: orm.Mapped[float | None] = orm.mapped_column(
        sa.Float)
    # The conductor group the service manages (None: all nodes), refreshed
    # at every cycle so that a SIGHUP change reaches the peers.
    partition_key: orm.Mapped[str | None] = orm.mapped_column(sa.String(255))
    # The Ironic shard it manages (None: any), part of its partition too.
    shard: orm.Mapped[str | None] = orm.mapped_column(sa.String(255))


class ComputeNode(_Timestamps, Base):
    """One Ironic node as capacity for the scheduler, owned by one host."""

    __tablename__ = 'compute_nodes'
    __table_args__ = (
        sa.UniqueConstraint('uuid', 'deleted',
                            name='uniq_compute_nodes0uuid0deleted'),
        # A service loads its own rows, and the peers that own any row.
        sa.Index('compute_nodes_host_deleted_idx', 'host', 'deleted'),
        sa.Index('compute_nodes_service_id_idx', 'service_id'),
    )

    id: orm.Mapped[int] = orm.mapped_column(sa.Integer, primary_key=True)
    uuid: orm.Mapped[str] = orm.mapped_column(sa.String(36), nullable=False)
    host: orm.Mapped[str | None] = orm.mapped_column(sa.String(255))
    service_id: orm.Mapped[int | None] = orm.mapped_column(
        sa.Integer, sa.ForeignKey('services.id'))
    hypervisor_type: orm.Mapped[str] = orm.mapped_column(
        sa.String(255), default='ironic', server_default='ironic',
        nullable=False)
    hypervisor_hostname: orm.Mapped[str | None] = orm.mapped_column(
        sa.String(255))
    conductor_group: orm.Mapped[str | None] = orm.mapped_column(
        sa.String(255))
    vcpus: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)
    memory_mb: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)
    local_gb: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)
    vcpus_used: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)
    memory_mb_used: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)
    local_gb_used: orm.Mapped[int] = orm.mapped_column(
        sa.Integer, default=0, server_default='0', nullable=False)
    cpu_arch: orm.Mapped[str | None] = orm.mapped_column(sa.String(32))
    cpu_info: orm.Mapped[str | None] = orm.mapped_column(sa.Text)
    resource_class: orm.Mapped[str | None] = orm.mapped_column(
        sa.String(255))
    # JSON: capabilities, provision state and other per-node facts.
    stats: orm.Mapped[str | None] = orm.mapped_column(sa.Text)


class Instance(_Timestamps, Base):
    """An instance placed on an Ironic node, managed by one host."""

    __tablename__ = 'instances'
    __table_args__ = (
        sa.UniqueConstraint('uuid', 'deleted',
                            name='uniq_instances0uuid0deleted'),
        sa.Index('instances_host_deleted_idx', 'host', 'deleted'),
        sa.Index('instances_node_deleted_idx', 'node', 'deleted'),
    )

    id: orm.Mapped[int] = orm.mapped_column(sa.Integer, primary_key=True)
    uuid: orm.Mapped[str] = orm.mapped_column(sa.String(36), nullable=False)
    host: orm.Mapped[str | None] = orm.mapped_column(sa.String(255))
    node: orm.Mapped[str | None] = orm.mapped_column(sa.String(36))
    vm_state: orm.Mapped[str | None] = orm.mapped_column(sa.String(255))
    task_state: orm.Mapped[str | None] = orm.mapped_column(sa.String(255))
