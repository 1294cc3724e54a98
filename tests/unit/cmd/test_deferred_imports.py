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

"""cmd/deferred_imports.py: a package is loaded on its first use, once,
and behaves as if it had been imported."""

import importlib
import subprocess
import sys

import pytest

from ironic_compute.cmd import deferred_imports

# A package whose code counts its runs in a file, and a submodule that
# reads its parent while it loads.
PACKAGE = {
    '__init__.py': (
        'import os\n'
        'with open(os.environ["RUNS_FILE"], "a") as f:\n'
        '    f.write("run\\n")\n'
        'ANSWER = 42\n'
        'def double(x):\n'
        '    return 2 * x\n'),
    'sub.py': 'from {name} import ANSWER\nVALUE = ANSWER + 1\n',
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """The name of a fresh package on sys.path, and the file of its runs."""
    name = f'deferred_probe_{tmp_path.name.replace("-", "_")}'
    root = tmp_path / name
    root.mkdir()
    for file, source in PACKAGE.items():
        (root / file).write_text(source.format(name=name))
    runs = tmp_path / 'runs'
    runs.write_text('')
    monkeypatch.setenv('RUNS_FILE', str(runs))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name, runs
    for module in [m for m in sys.modules if m == name or m.startswith(name + '.')]:
        del sys.modules[module]


def test_the_import_statement_does_not_run_the_package(package):
    name, runs = package
    assert deferred_imports.defer([name]) == [name]
    module = importlib.import_module(name)
    exec(f'import {name}', {})
    assert runs.read_text() == ''
    # Its spec and path are there without running it (the import system
    # reads them).
    assert module.__spec__.name == name
    assert module.__path__


def test_the_first_attribute_runs_it_once(package):
    name, runs = package
    deferred_imports.defer([name])
    module = importlib.import_module(name)
    assert module.double(module.ANSWER) == 84
    assert module.ANSWER == 42
    assert runs.read_text() == 'run\n'
    assert type(module) is type(sys)  # a plain module from then on


def test_from_import_and_a_submodule_load_it(package):
    name, runs = package
    deferred_imports.defer([name])
    namespace = {}
    exec(f'from {name} import double\nfrom {name}.sub import VALUE', namespace)
    assert namespace['double'](2) == 4
    assert namespace['VALUE'] == 43
    assert runs.read_text() == 'run\n'


def test_a_missing_attribute_is_still_an_attribute_error(package):
    name, runs = package
    deferred_imports.defer([name])
    module = importlib.import_module(name)
    with pytest.raises(AttributeError):
        getattr(module, "no_such_name")  # noqa: B009 - the attribute read is the test
    assert runs.read_text() == 'run\n'


def test_an_imported_or_missing_package_is_left_alone():
    assert 'json' in sys.modules
    json_module = sys.modules['json']
    assert deferred_imports.defer(['json', 'no_such_package_anywhere']) == []
    assert sys.modules['json'] is json_module
    assert 'no_such_package_anywhere' not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module('no_such_package_anywhere')


def test_a_submodule_is_deferred_and_its_parent_imported(package):
    name, runs = package
    assert deferred_imports.defer([f'{name}.sub']) == [f'{name}.sub']
    # The parent ran (it is imported now, as by an import of the
    # submodule); the submodule's code did not.
    assert runs.read_text() == 'run\n'
    namespace = {}
    exec(f'from {name} import sub\nimport {name}.sub as again', namespace)
    assert namespace['sub'] is namespace['again'] is sys.modules[f'{name}.sub']
    assert type(namespace['sub']) is deferred_imports._DeferredModule
    assert namespace['sub'].VALUE == 43
    assert type(namespace['sub']) is type(sys)


def test_oslo_config_works_with_its_extras_deferred():
    # In a new process, as the console script: the option types that use
    # netaddr and rfc3986 still validate, stevedore loads on first use, and
    # oslo.serialization still serialises xmlrpc's DateTime.
    code = (
        'from ironic_compute.cmd import deferred_imports\n'
        'print(sorted(deferred_imports.defer()))\n'
        'from oslo_config import cfg, types\n'
        'import netaddr\n'
        'print(type(netaddr).__name__)\n'
        'print(types.IPAddress()("192.0.2.1"), types.URI()("http://h/p"))\n'
        'try:\n'
        '    types.IPAddress()("not-an-address")\n'
        'except ValueError:\n'
        '    print("refused")\n'
        'import stevedore\n'
        'print(stevedore.ExtensionManager.__name__)\n'
        'from oslo_serialization import jsonutils\n'
        'import xmlrpc.client\n'
        'print(jsonutils.to_primitive(xmlrpc.client.DateTime("20260102T03:04:05")))\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, check=True)
    assert done.stdout.splitlines() == [
        "['netaddr', 'rfc3986', 'stevedore', 'xmlrpc.client']", '_DeferredModule',
        '192.0.2.1 http://h/p', 'refused', 'ExtensionManager', '2026-01-02T03:04:05.000000']
