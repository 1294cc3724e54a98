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

"""Migration trees of a simulated older and a simulated newer release.

The older one is a copy of this release's migrations without the revisions
after OLD_HEAD; the newer one adds 0901 (expand-only: a new column) and
0902 (contract: drops a column this release reads).
"""

import os
import shutil
import textwrap

from ironic_compute.db import migration

_SOURCE = os.path.join(os.path.dirname(migration.__file__), 'migrations')
OLD_HEAD = '0003'

_EXTRA = {
    '0901_scratch_column.py': ('0901', None, True, '''
        with op.batch_alter_table('services') as batch:
            batch.add_column(sa.Column('scratch', sa.String(16)))
    '''),
    '0902_drop_hypervisor_hostname.py': ('0902', '0901', False, '''
        with op.batch_alter_table('compute_nodes') as batch:
            batch.drop_column('hypervisor_hostname')
    '''),
}


def _tree(tmp_path, name):
    tree = tmp_path / name
    shutil.copytree(_SOURCE, tree, ignore=shutil.ignore_patterns('__pycache__'))
    return tree


def older_release(tmp_path):
    """Migrations of a release whose head is OLD_HEAD."""
    tree = _tree(tmp_path, 'older')
    for path in (tree / 'versions').glob('*.py'):
        if path.name.split('_')[0] > OLD_HEAD:
            path.unlink()
    return str(tree)


def newer_release(tmp_path):
    """This release's migrations plus 0901 (expand) and 0902 (contract)."""
    tree = _tree(tmp_path, 'newer')
    for filename, (rev, down, expand, body) in _EXTRA.items():
        down = down or migration.head()
        (tree / 'versions' / filename).write_text(
            'import sqlalchemy as sa\nfrom alembic import op\n\n'
            f'revision = {rev!r}\ndown_revision = {down!r}\n'
            f'expand_only = {expand}\n\n\ndef upgrade():\n'
            + textwrap.indent(textwrap.dedent(body).strip(), '    ') + '\n')
    return str(tree)
