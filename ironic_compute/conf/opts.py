"""Entry points for oslo-config-generator."""

from ironic_compute import report
from ironic_compute.conf import database
from ironic_compute.conf import default
from ironic_compute.conf import hash_ring
from ironic_compute.conf import instances
from ironic_compute.conf import ironic


def list_opts():
    """(group, options) pairs, from the modules' {group: options}."""
    groups = {}
    for module in (default, instances, hash_ring, ironic, database, report):
        for group, options in module.list_opts().items():
            groups.setdefault(group, []).extend(options)
    return list(groups.items())

