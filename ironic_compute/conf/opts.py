"""Entry points for oslo-config-generator."""

from ironic_compute import report
from ironic_compute.conf import database
from ironic_compute.conf import default
from ironic_compute.conf import hash_ring
from ironic_compute.conf import instances
from ironic_compute.conf import ironic


def list_opts():
    groups = [('DEFAULT', default.list_opts() + instances.list_opts())]
    groups += list(hash_ring.list_opts().items())
    groups += list(ironic.list_opts().items())
    groups += database.list_opts()
    groups += report.list_opts()
    return groups

