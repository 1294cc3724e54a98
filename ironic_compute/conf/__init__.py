"""Configuration: one module per option group.

Nothing is registered at import: an entry point (cmd/) or a test calls
:func:`register_opts` on the ConfigOpts it uses (``CONF`` in the
processes), as placement does.
"""

from oslo_config import cfg

from ironic_compute.conf import database
from ironic_compute.conf import default
from ironic_compute.conf import hash_ring
from ironic_compute.conf import instances
from ironic_compute.conf import ironic

CONF = cfg.CONF
MODULES = (default, database, hash_ring, instances, ironic)


def register_opts(conf):
    """Register every option of the service on ``conf``."""
    for module in MODULES:
        module.register_opts(conf)
