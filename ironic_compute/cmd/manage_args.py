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

"""Arguments of the ironic-compute-manage actions, declared on the methods.

::

    @args('host', help='...')
    @args('--reason', help='...')
    def disable(self, host, reason=None): ...

``add_command_parsers`` adds each declared argument to the action's parser
and ``main`` passes each value to the method under the argument's name
(``--vm-state`` -> ``vm_state``).

oslo.config keeps the values of all sub-command arguments in the namespace
of its own options, and refuses to return one whose name is also an option
(``host`` is one), so the values are stored under a prefixed dest.
"""

import uuid

from ironic_compute import exception
from ironic_compute.cmd import output

_PREFIX = 'arg_'


def args(*flags, **kwargs):
    """Declare one argparse argument of the decorated action method.

    The method gets the value under ``dest`` if given, else under the name
    of the argument (the first long option, or the positional's name).
    """
    kwargs = dict(kwargs)
    name = kwargs.pop('dest', None) or next(
        (f for f in flags if f.startswith('--')), flags[0]
    ).lstrip('-').replace('-', '_')
    if flags[0].startswith('-'):
        flag = kwargs.get('action') in ('store_true', 'store_false')
        shown = ({} if 'choices' in kwargs or flag
                 else {'metavar': name.upper()})
        spec = (flags, {**shown, **kwargs, 'dest': _PREFIX + name})
    else:
        # A positional argument's dest is its first (and only) name.
        spec = ((_PREFIX + name,), {'metavar': flags[0].upper(), **kwargs})

    def decorate(method):
        # Decorators apply bottom-up: prepend to keep the written order.
        method.args = [spec, *getattr(method, 'args', ())]
        method.kwargs = [name, *getattr(method, 'kwargs', ())]
        return method

    return decorate


def uses_clients(method):
    """Mark an action that talks to Ironic or Placement in a category of
    ``manage.WITHOUT_CLIENTS``: keystoneauth's options of [ironic] and
    [placement] are registered (and checked) when it runs. Returns
    ``method``."""
    method.uses_clients = True
    return method


def uses_clients_if(predicate):
    """Mark an action that talks to Ironic or Placement only when
    ``predicate(conf)`` holds (read after the files are parsed), as
    uses_clients does. Returns the decorator."""
    def decorate(method):
        method.uses_clients = predicate
        return method
    return decorate


def values(method, namespace):
    """The keyword arguments of ``method`` from the parsed ``namespace``."""
    return {name: getattr(namespace, _PREFIX + name)
            for name in getattr(method, 'kwargs', ())}


format_option = args(
    '--format', choices=output.FORMATS, default='table',
    help='table (default) for people, json for scripts')
wait_option = args('--wait', action='store_true', default=False,
                   help='wait until the request is carried out')
timeout_option = args('--timeout', type=float, default=600.0, metavar='S',
                      help='with --wait: give up after S seconds '
                           '(default 600)')


def request_options(func):
    """--wait, --timeout and --format: every command that asks for work
    (the instance actions). Returns ``func``, decorated."""
    return wait_option(timeout_option(format_option(func)))


def lookup_uuid(value, what='node'):
    """A uuid to look up, in canonical form; refused unless it parses.

    "no compute node X" would send the operator looking for a node that
    cannot exist.
    """
    return new_uuid(value, what)


def new_uuid(value, what):
    """A uuid to record: refused (one line) unless it is a valid uuid."""
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        raise exception.CommandError(f'{what} {value!r} is not a UUID') from None
