"""[database] options: oslo.db's, with an embedded SQLite default."""

from oslo_config import cfg
from oslo_db import options as db_options

# The default lets a single service run without a database server; several
# services on several hosts need a shared MySQL/MariaDB or PostgreSQL.
DEFAULT_CONNECTION = 'sqlite:///$state_path/ironic_compute.sqlite'


def register_opts(conf):
    db_options.set_defaults(conf, connection=DEFAULT_CONNECTION)


def list_opts():
    groups = db_options.list_opts()  # copies of oslo.db's options
    for _group, opts in groups:
        cfg.set_defaults(opts, connection=DEFAULT_CONNECTION)
    return groups
