"""ironic-compute: the compute service daemon."""

import sys

from oslo_service import backend

from ironic_compute.cmd import common
from ironic_compute.conf import validation

PROG = 'ironic-compute'


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    common.set_log_defaults()
    with common.one_line_errors(PROG):
        common.parse_config(argv, PROG)
        validation.validate_service(common.CONF)
        # The threading backend of oslo.service (its default, eventlet, is
        # deprecated), chosen before the service loads oslo.service.
        backend.init_backend(backend.BackendType.THREADING)
        from ironic_compute import service
        try:
            return service.run(common.CONF)
        except service.SchemaError as exc:
            raise common.CommandError(str(exc)) from exc


if __name__ == '__main__':
    sys.exit(main())
