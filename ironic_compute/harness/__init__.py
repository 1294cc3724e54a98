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

"""Support for the tests, tools/ and the demo; never imported by the service.

One way to do what they all need, free of pytest (its glue, fixtures and
the choice between skipping and failing, stays in ``tests/``):

- :mod:`.databases`: the project's MariaDB and PostgreSQL test servers, a
  fresh database on them (or a SQLite file) and ``on_ci()``;
- :mod:`.ironic`: a real standalone Ironic (install, start, stop; also
  ``tools/ironic_standalone.py``'s CLI) and its fake nodes, through
  ironicclient (create, make available, power off, list, delete);
- :mod:`.fleet`: real ``ironic-compute`` processes, the samplers that read
  their database, a TCP proxy to cut them off, ``wait_until``;
- :mod:`.fakes`: an in-memory Ironic for the unit tests and the cycle
  benchmark;
- :mod:`.bench`: what the benchmarks in tools/ share.

The package and :mod:`.ironic` import only the standard library (plus
ironicclient, lazily, for the node helpers).
"""
