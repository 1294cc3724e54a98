"""Configuration: one module per option group, all registered on ``CONF``."""

from oslo_config import cfg

from ironic_compute.conf import database
from ironic_compute.conf import default
from ironic_compute.conf import hash_ring
from ironic_compute.conf import instances
from ironic_compute.conf import ironic

CONF = cfg.CONF
MODULES = (default, database, hash_ring, instances, ironic)


def register_all(conf):
    """Register every option of the service on ``conf``."""
    for module in MODULES:
        module.register_opts(conf)


register_all(CONF)
