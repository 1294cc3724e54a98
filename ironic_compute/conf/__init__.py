"""Configuration: one module per option group, all registered on ``CONF``."""

from oslo_config import cfg

from ironic_compute.conf import database
from ironic_compute.conf import default
from ironic_compute.conf import hash_ring
from ironic_compute.conf import ironic

CONF = cfg.CONF

default.register_opts(CONF)
database.register_opts(CONF)
hash_ring.register_opts(CONF)
ironic.register_opts(CONF)
