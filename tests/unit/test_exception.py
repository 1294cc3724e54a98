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

"""exception.py is the one place where the project's exceptions are
defined: each once, under one base class, with a docstring; and it is pure,
so that every room may import it."""

import ast
import importlib
import inspect
import pathlib
import pkgutil

import ironic_compute
from ironic_compute import exception

# Not the service: the harness keeps its own errors (the tests' and the
# tools' support, which the service never imports).
NOT_THE_SERVICE = ('ironic_compute.harness', 'ironic_compute.db.migrations')


def _project_exceptions():
    """(module name, class name) of every public exception class that a
    module of the service defines, exception.py included."""
    found = []
    for info in pkgutil.walk_packages(ironic_compute.__path__,
                                      'ironic_compute.'):
        if info.name.startswith(NOT_THE_SERVICE):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == info.name
                    and not name.startswith('_')):
                found.append((info.name, name))
    return found


def test_every_exception_is_defined_in_exception_py_once():
    elsewhere = [f'{module}.{name}' for module, name in _project_exceptions()
                 if module != exception.__name__]
    assert elsewhere == []


def test_every_exception_has_the_base_class_and_says_when_it_is_raised():
    for _, name in _project_exceptions():
        cls = getattr(exception, name)
        assert issubclass(cls, exception.IronicComputeError), name
        assert cls.__doc__ and cls.__doc__.strip(), name


def test_no_module_re_exports_an_exception():
    classes = {id(value) for value in vars(exception).values()
               if inspect.isclass(value)}
    for info in pkgutil.walk_packages(ironic_compute.__path__,
                                      'ironic_compute.'):
        if info.name.startswith(NOT_THE_SERVICE) or (
                info.name == exception.__name__):
            continue
        module = importlib.import_module(info.name)
        aliases = [name for name, value in vars(module).items()
                   if id(value) in classes]
        assert aliases == [], info.name


def test_the_names_that_were_shared_are_distinct():
    for name in ('IronicRefused', 'RequestRefused', 'AdminRefused',
                 'IronicNotFound', 'AdminNotFound'):
        assert getattr(exception, name).__name__ == name
    assert not hasattr(exception, 'Refused')
    assert not hasattr(exception, 'NotFound')


def test_the_value_errors_stay_value_errors():
    for cls in (exception.InvalidRequest, exception.PeerListError,
                exception.EmptyRingError):
        assert issubclass(cls, ValueError)


def test_exception_py_is_pure():
    tree = ast.parse(pathlib.Path(exception.__file__).read_text())
    imports = [node for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports == []
