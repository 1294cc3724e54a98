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

"""Modules a command imports but seldom uses, loaded on their first use.

oslo.config imports stevedore (for configuration source drivers), netaddr
(for IP address options) and rfc3986 (for URI options) when it is imported,
and oslo.log's formatters import xmlrpc.client (through oslo.serialization,
for one type of value it may serialise). They use them only inside the
functions that need them. None of the project's options is of those types,
no configuration names a source driver, and a command serialises nothing
with oslo.serialization, so a command never calls them; importing them is
a tenth of the start-up of ``instance list`` (doc/cli.md, "Start-up").

``defer()`` puts a module in ``sys.modules`` that holds only what the
import system reads of a module (its spec, path and file; for a submodule,
the parent's attribute too). The first read of any other attribute runs
the package's code in that same module:
``import netaddr`` then costs nothing, and ``netaddr.valid_ipv4(...)``
(or ``from netaddr import X``) loads the real package first. The standard
library's ``importlib.util.LazyLoader`` does not do here: on Python 3.11
an ``import`` statement reads ``__spec__`` of a module it finds in
``sys.modules``, which loads a LazyLoader's module at once.
"""

import importlib.util
import sys
import threading
import types

# What oslo.config and oslo.log import and do not use unless asked (see
# above).
OSLO_EXTRAS = ('stevedore', 'netaddr', 'rfc3986', 'xmlrpc.client')

_loading = threading.Lock()


class _DeferredModule(types.ModuleType):
    """A module whose code runs when a missing attribute is first read."""

    def __getattr__(self, attr):
        # Called only for an attribute the module does not have yet.
        with _loading:
            if type(self) is _DeferredModule:
                # A plain module again before its code runs: a name the
                # package itself reads while it loads is looked up as in
                # any module.
                self.__class__ = types.ModuleType
                self.__spec__.loader.exec_module(self)
        return getattr(self, attr)


def defer(names=OSLO_EXTRAS):
    """Make each module of ``names`` load on its first use.

    A module already imported, or not installed, is left as it is (an
    import of a missing module still fails where it is made). The parent
    package of a submodule is imported now, and given the deferred module
    as its attribute, as an import would. Returns the names deferred.
    """
    deferred = []
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _DeferredModule
        sys.modules[name] = module
        parent, _, child = name.rpartition('.')
        if parent:
            setattr(sys.modules[parent], child, module)
        deferred.append(name)
    return deferred
