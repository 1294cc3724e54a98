"""${message}
"""

from alembic import op
import sqlalchemy as sa
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
# True when a service of the previous release still runs on the schema this
# leaves (it only adds); False when it removes or changes what that service
# uses. See ironic_compute/db/migration.py.
expand_only = False


def upgrade():
    ${upgrades if upgrades else "pass"}
