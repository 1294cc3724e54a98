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

"""The layers of the package, the direction its imports may take, and the
size of its classes.

LAYERS is the one statement of the layers: doc/architecture.md shows the
same table (a test below renders it and looks for it there). Every module
of ironic_compute/ belongs to the layer of the longest entry that matches
its path, and may import only its own layer and the layers before it. The
imports are read with ast, so an import inside a function counts too.
"""

import ast
import pathlib

import pytest

import ironic_compute

PACKAGE = pathlib.Path(ironic_compute.__file__).parent
ARCHITECTURE = PACKAGE.parent / 'doc' / 'architecture.md'

# (layer, paths under ironic_compute/), lowest first. A path ending in '/'
# is a folder; a module in it belongs there unless a longer entry names it.
LAYERS = (
    ('base', ('__init__.py', 'exception.py', 'text.py', 'redaction.py', 'lru.py',
              'outage.py', 'cluster/hosts.py')),
    ('rules', ('ring/', 'cluster/', 'nodes/ownership.py', 'nodes/partition.py',
               'nodes/sync_plan.py', 'instances/model.py',
               'instances/configdrive.py', 'instances/scheduler.py', 'placement/provider.py',
               'placement/audit.py')),
    ('conf', ('conf/',)),
    ('adapters', ('db/', 'ironic.py', 'instances/answers.py', 'instances/calls.py',
                  'instances/polls.py', 'instances/provision.py',
                  'placement/client.py')),
    ('flows', ('nodes/', 'instances/', 'placement/')),
    ('daemon', ('daemon/',)),
    ('cmd', ('cmd/',)),
    ('harness', ('harness/',)),
)

# What makes a rule impure: a database, Ironic, the network, a process, or
# the configuration (the rules get their settings as arguments).
IMPURE_LIBRARIES = ('sqlalchemy', 'oslo_db', 'ironicclient', 'keystoneauth1',
                    'oslo_service', 'oslo_config', 'requests', 'socket',
                    'subprocess', 'urllib', 'http')


def layer_of(path):
    """Return (index, name) of the layer of ``path`` (relative to the package).

    Raises AssertionError when no entry of LAYERS matches: a new module or
    folder must be placed in the table before it can be imported.
    """
    best = None
    for index, (name, entries) in enumerate(LAYERS):
        for entry in entries:
            matches = path.startswith(entry) if entry.endswith('/') else path == entry
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), index, name)
    assert best is not None, f'ironic_compute/{path} is in no layer: add it to LAYERS'
    return best[1], best[2]


def module_path(dotted):
    """Return the path under ironic_compute/ of module ``dotted``, or None.

    None means the name is not a module or package of ours (an attribute
    imported with ``from``).
    """
    parts = dotted.split('.')[1:]
    base = PACKAGE.joinpath(*parts)
    if base.with_suffix('.py').is_file():
        return '/'.join(parts) + '.py'
    if (base / '__init__.py').is_file():
        return '/'.join([*parts, '__init__.py'])
    return None


def imported_paths(path):
    """Return the paths (under ironic_compute/) of our modules that ``path`` imports."""
    name = 'ironic_compute.' + path.removesuffix('.py').replace('/', '.')
    package = name.removesuffix('.__init__').split('.')
    if not path.endswith('__init__.py'):
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / path).read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ''
            if node.level:
                module = '.'.join(package[:len(package) - node.level + 1]
                                  + ([module] if module else []))
            # "from a import b" names the module a.b when b is a module, and
            # module a when b is an attribute of it. (A package's __init__
            # runs on any import from it; those files import only their own
            # folder, which the test checks like any other module.)
            names = [f'{module}.{alias.name}' if module_path(f'{module}.{alias.name}')
                     else module for alias in node.names]
        else:
            continue
        for dotted in names:
            if dotted == 'ironic_compute' or dotted.startswith('ironic_compute.'):
                target = module_path(dotted)
                if target is not None:
                    found.add(target)
    return found


def third_party(path):
    """Return the top-level names of what ``path`` imports from outside the package."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / path).read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split('.')[0])
    return found - {'ironic_compute'}


def modules():
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py'))


def render_table():
    """Return LAYERS as the markdown table doc/architecture.md shows."""
    lines = ['| layer | modules and folders under `ironic_compute/` |',
             '| --- | --- |']
    for index, (name, entries) in enumerate(LAYERS, 1):
        lines.append(f'| {index} {name} | ' + ', '.join(f'`{e}`' for e in entries) + ' |')
    return '\n'.join(lines)


def test_every_import_goes_down_or_sideways():
    wrong = []
    for path in modules():
        own, own_name = layer_of(path)
        for target in sorted(imported_paths(path)):
            index, name = layer_of(target)
            if index > own:
                wrong.append(f'{path} ({own_name}) imports {target} ({name})')
    assert wrong == []


def test_the_rules_use_no_database_ironic_network_or_configuration():
    rules = [i for i, (name, _) in enumerate(LAYERS) if name in ('base', 'rules')]
    wrong = {path: sorted(third_party(path) & set(IMPURE_LIBRARIES))
             for path in modules() if layer_of(path)[0] in rules}
    assert {path: libs for path, libs in wrong.items() if libs} == {}


@pytest.mark.parametrize('path, layer', [
    ('ring/assignment.py', 'rules'),
    ('cluster/lease.py', 'rules'),
    ('cluster/hosts.py', 'base'),
    ('nodes/ownership.py', 'rules'),
    ('nodes/tracker.py', 'flows'),
    ('instances/provision.py', 'adapters'),
    ('instances/build.py', 'flows'),
    ('harness/fleet.py', 'harness'),
])
def test_the_longest_entry_places_a_module(path, layer):
    assert layer_of(path)[1] == layer


def test_an_upward_import_is_seen(tmp_path, monkeypatch):
    # The checker itself: a rule that imports the database, from a function
    # body and through a relative import, is reported.
    package = tmp_path / 'ironic_compute'
    (package / 'nodes').mkdir(parents=True)
    (package / 'db').mkdir()
    for path in ('__init__.py', 'nodes/__init__.py', 'db/__init__.py', 'db/api.py'):
        (package / path).write_text('')
    (package / 'nodes' / 'ownership.py').write_text(
        'def f():\n    from ..db import api\n    return api\n')
    monkeypatch.setitem(globals(), 'PACKAGE', package)
    assert imported_paths('nodes/ownership.py') == {'db/api.py'}
    assert layer_of('db/api.py')[0] > layer_of('nodes/ownership.py')[0]


def test_architecture_md_shows_the_table():
    assert render_table() in ARCHITECTURE.read_text(), (
        'doc/architecture.md must show this table:\n' + render_table())


# The rule for a module a developer reads whole: no class of the
# service over this many lines (tests/ and tools/ are not held to it).
MAX_CLASS_LINES = 250


def test_no_class_of_the_package_is_over_250_lines():
    large = {}
    for path in modules():
        for node in ast.walk(ast.parse((PACKAGE / path).read_text())):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    large[f'{path}:{node.name}'] = size
    assert large == {}
