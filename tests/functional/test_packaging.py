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

"""The wheel of the service, built from this checkout, and what is in it.

The harness is not installed with the service (doc/architecture.md): the
wheel holds every module of the service, its migrations and the sample
configuration, and nothing of ironic_compute/harness/.

The wheel is built from a copy of the files git would see (tracked, and
new files not ignored), in a fresh git repository: pbr reads the package
data from git, and a build in the checkout itself would leave a build/
directory whose stale files a later build copies into its wheel.
"""

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.functional

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]


def git(*args, cwd=CHECKOUT):
    """Return git's output of ``args`` run in ``cwd``; raises CalledProcessError."""
    return subprocess.run(['git', *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope='module')
def wheel_names(tmp_path_factory):
    """Return the names of the files in the wheel built from this checkout."""
    copy = tmp_path_factory.mktemp('checkout')
    files = git('ls-files', '--cached', '--others', '--exclude-standard', '-z').split('\0')
    for name in filter(None, files):
        source = CHECKOUT / name
        if source.is_file():  # a file deleted but not yet staged is listed too
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes(source.read_bytes())
    git('init', '-q', cwd=copy)
    git('add', '-A', cwd=copy)
    out = tmp_path_factory.mktemp('wheel')
    env = dict(os.environ, PBR_VERSION='1.0.0')  # the copy has no history
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps',
                    '--wheel-dir', str(out), str(copy)], check=True, env=env)
    [wheel] = out.glob('*.whl')
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_holds_the_service_and_not_the_harness(wheel_names):
    service = {str(path.relative_to(CHECKOUT))
               for path in (CHECKOUT / 'ironic_compute').rglob('*.py')
               if 'harness' not in path.parts}
    assert service <= wheel_names
    assert [name for name in wheel_names if '/harness/' in name] == []
    assert 'ironic_compute/db/migrations/script.py.mako' in wheel_names
    assert any(name.endswith('data/etc/ironic-compute/ironic-compute.conf.sample')
               for name in wheel_names)
