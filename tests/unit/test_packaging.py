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

"""The harness is not installed with the service (doc/architecture.md).

The setup.cfg that pbr and setuptools build the wheel from lists every
package of the service and leaves ironic_compute/harness/ out, both as a
package and as package data. The tests and tools import the harness from
this checkout, through the editable install that tox, tools/run-tests.sh
and the demo make. tests/functional/test_packaging.py builds the wheel
itself and looks inside.
"""

import pathlib
import warnings

from setuptools.config import setupcfg

import ironic_compute
from ironic_compute.harness import fleet
from ironic_compute.harness import ironic as standalone

PACKAGE = pathlib.Path(ironic_compute.__file__).parent
CHECKOUT = PACKAGE.parent


def read_setup_cfg(monkeypatch):
    """Return setuptools' reading of setup.cfg, with ``find:`` resolved."""
    monkeypatch.chdir(CHECKOUT)  # find: looks under the working directory
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return setupcfg.read_configuration('setup.cfg')['options']


def service_packages():
    """Return the dotted names of the packages of the service (not the harness)."""
    return sorted('.'.join(path.parent.relative_to(CHECKOUT).parts)
                  for path in PACKAGE.rglob('__init__.py')
                  if 'harness' not in path.parts)


def test_the_wheel_lists_every_package_of_the_service_and_not_the_harness(monkeypatch):
    options = read_setup_cfg(monkeypatch)
    assert sorted(options['packages']) == service_packages()
    assert 'ironic_compute.harness' not in options['packages']


def test_the_harness_files_are_not_package_data_either(monkeypatch):
    # pbr adds every file git tracks under a package as package data, so a
    # folder left out of the packages would still be copied without this.
    options = read_setup_cfg(monkeypatch)
    assert options['exclude_package_data'] == {'ironic_compute': ['harness/*']}


def test_the_harness_runs_from_this_checkout():
    # Its defaults (.ironic/ for Ironic's venv and state, the daemons'
    # working directory where tests.functional's entry points are found)
    # are paths of the checkout it is imported from.
    assert pathlib.Path(standalone.__file__).is_relative_to(CHECKOUT)
    assert standalone.REPO_ROOT == CHECKOUT
    assert pathlib.Path(fleet.REPO_ROOT) == CHECKOUT
    assert (CHECKOUT / 'tests' / 'functional').is_dir()
