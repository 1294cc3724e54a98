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

"""ironic-compute: the compute service daemon."""

import sys

from oslo_service import backend

from ironic_compute import exception
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
        from ironic_compute.daemon import service
        try:
            return service.run(common.CONF)
        except exception.SchemaError as exc:
            raise exception.CommandError(str(exc)) from exc


if __name__ == '__main__':
    sys.exit(main())
