"""ironic-compute: the compute service daemon."""

import sys

from ironic_compute.cmd import common
from ironic_compute.conf import validation

PROG = 'ironic-compute'


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    common.set_log_defaults()
    with common.one_line_errors(PROG):
        common.parse_config(argv, PROG)
        validation.validate_service(common.CONF)
        # The service itself is imported late: it selects the oslo.service
        # backend, which must happen before oslo.service is loaded.
        from ironic_compute import service
        try:
            return service.run(common.CONF)
        except service.SchemaError as exc:
            raise common.CommandError(str(exc)) from exc


if __name__ == '__main__':
    sys.exit(main())
