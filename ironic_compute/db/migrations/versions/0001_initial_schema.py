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

"""The initial schema: services, compute_nodes and instances.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
# The first schema: no release runs on the database before it.
expand_only = False


def _timestamps():
    return [
        sa.Column('created_at', sa.DateTime, nullable=False),
        sa.Column('updated_at', sa.DateTime),
        sa.Column('deleted_at', sa.DateTime),
        sa.Column('deleted', sa.Integer, server_default='0', nullable=False),
    ]


def upgrade():
    op.create_table(
        'services',
        sa.Column('id', sa.Integer, primary_key=True),
        sa.Column('host', sa.String(255), nullable=False),
        sa.Column('binary', sa.String(255), nullable=False),
        sa.Column('topic', sa.String(255)),
        sa.Column('report_count', sa.Integer, server_default='0',
                  nullable=False),
        sa.Column('disabled', sa.Boolean, server_default=sa.false(),
                  nullable=False),
        sa.Column('disabled_reason', sa.String(255)),
        sa.Column('forced_down', sa.Boolean, server_default=sa.false(),
                  nullable=False),
        sa.Column('last_seen_up', sa.DateTime),
        sa.Column('stopped_at', sa.DateTime),
        sa.Column('last_cycle_at', sa.DateTime),
        sa.Column('last_cycle_seconds', sa.Float),
        *_timestamps(),
        sa.UniqueConstraint('host', 'binary', 'deleted',
                            name='uniq_services0host0binary0deleted'),
    )
    op.create_index('services_binary_deleted_idx', 'services',
                    ['binary', 'deleted'])

    op.create_table(
        'compute_nodes',
        sa.Column('id', sa.Integer, primary_key=True),
        sa.Column('uuid', sa.String(36), nullable=False),
        sa.Column('host', sa.String(255)),
        sa.Column('service_id', sa.Integer, sa.ForeignKey('services.id')),
        sa.Column('hypervisor_type', sa.String(255),
                  server_default='ironic', nullable=False),
        sa.Column('hypervisor_hostname', sa.String(255)),
        sa.Column('conductor_group', sa.String(255)),
        sa.Column('vcpus', sa.Integer, server_default='0', nullable=False),
        sa.Column('memory_mb', sa.Integer, server_default='0',
                  nullable=False),
        sa.Column('local_gb', sa.Integer, server_default='0',
                  nullable=False),
        sa.Column('vcpus_used', sa.Integer, server_default='0',
                  nullable=False),
        sa.Column('memory_mb_used', sa.Integer, server_default='0',
                  nullable=False),
        sa.Column('local_gb_used', sa.Integer, server_default='0',
                  nullable=False),
        sa.Column('cpu_arch', sa.String(32)),
        sa.Column('cpu_info', sa.Text),
        sa.Column('resource_class', sa.String(255)),
        sa.Column('stats', sa.Text),
        *_timestamps(),
        sa.UniqueConstraint('uuid', 'deleted',
                            name='uniq_compute_nodes0uuid0deleted'),
    )
    op.create_index('compute_nodes_host_deleted_idx', 'compute_nodes',
                    ['host', 'deleted'])
    op.create_index('compute_nodes_service_id_idx', 'compute_nodes',
                    ['service_id'])

    op.create_table(
        'instances',
        sa.Column('id', sa.Integer, primary_key=True),
        sa.Column('uuid', sa.String(36), nullable=False),
        sa.Column('host', sa.String(255)),
        sa.Column('node', sa.String(36)),
        sa.Column('vm_state', sa.String(255)),
        sa.Column('task_state', sa.String(255)),
        *_timestamps(),
        sa.UniqueConstraint('uuid', 'deleted',
                            name='uniq_instances0uuid0deleted'),
    )
    op.create_index('instances_host_deleted_idx', 'instances',
                    ['host', 'deleted'])
    op.create_index('instances_node_deleted_idx', 'instances',
                    ['node', 'deleted'])
