#!/usr/bin/env python3
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

"""Run a real, standalone OpenStack Ironic on this machine for tests and demos.

    python tools/ironic_standalone.py install          # venv + ``pip install ironic`` (~40 s, once)
    python tools/ironic_standalone.py start            # config, DB, processes; waits until ready
    python tools/ironic_standalone.py status [--json]
    python tools/ironic_standalone.py stop             # SIGTERM, then SIGKILL; idempotent

The CLI of ``ironic_compute.harness.ironic_cli`` (what it runs and where: see
``ironic_compute.harness.ironic``), so it needs a Python with the project installed
from this checkout: a tox env's (``.tox/functional/bin/python``), the demo's
(``.demo/venv/bin/python``) or any virtualenv with ``pip install -e .`` (the harness is
not in a wheel).
"""

import sys

try:
    from ironic_compute.harness import ironic_cli
except ImportError as exc:
    sys.exit(f"ironic-standalone: error: {exc}: run this with a Python that has the project "
             "installed (pip install -e .), e.g. .tox/functional/bin/python")

if __name__ == "__main__":
    sys.exit(ironic_cli.main())
