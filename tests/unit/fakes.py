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

"""A fake Ironic at the adapter boundary, for unit tests (``FakeIronic`` and
``make_node`` are ``ironic_compute.harness.fakes``'s)."""

import dataclasses
import time

from ironicclient import exc as ironic_exc

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.cluster import lease
from ironic_compute.harness.fakes import FakeIronic
from ironic_compute.harness.fakes import make_node  # noqa: F401


def valid_lease(margin=3600.0):
    """A lease renewed now that stays valid for ``margin`` seconds."""
    held = lease.Lease(lambda: margin)
    held.renewed(lease.now())
    return held


class _Record:
    """What ironicclient returns: attributes."""

    def __init__(self, **values):
        self.__dict__.update(values)


class FakeBaremetal(FakeIronic):
    """FakeIronic that also reserves, deploys and tears down (instantly).

    The adapter boundary of provision.Provisioner: ``request('manager.method',
    ...)`` over ironicclient's ``allocation`` and ``node`` managers, whose
    errors pass through ``ironic.provisioning_errors`` as the real adapter's.
    Allocations pick the first free candidate, as Ironic does; ``deploy_fails`` makes deploys end
    in ``deploy failed``, ``deploy_hangs`` leaves them ``deploying`` (until a
    test ends them: ``targets`` holds the transitional targets);
    ``unavailable`` makes every call fail.
    """

    def __init__(self, nodes=()):
        super().__init__(nodes)
        self.allocations = {}
        self.created_allocations = []  # every allocation ever made
        self.deploy_fails = False
        self.deploy_hangs = False
        self.targets = {}  # node uuid -> target_provision_state
        self.unavailable = False
        self.on_node_get = None  # called with the uuid before each node read
        self.soft_power_refused = False  # a power interface without soft
        self.power_hangs = False  # power actions never end (target stays)
        self.rescue_hangs = False  # a rescue stays in "rescue wait"
        self.rescue_fails = False  # rescues and unrescues end "... failed"
        # Soft actions are accepted but the OS never obeys: in flight until
        # the timeout they were given, then ended by Ironic, power unchanged.
        self.soft_power_ignored = False
        self.soft_timeouts = []  # the timeout of every soft call
        self._soft_ends = {}  # node uuid -> monotonic time its soft ends
        self.last_errors = {}  # node uuid -> last_error (a power failure)
        self.power_calls = []  # every (node, target, soft) sent
        self.power_targets = {}  # node uuid -> target_power_state
        self._changes = {}  # node uuid -> [power changes, provision changes]
        self.allocation = _Manager(self, 'allocation')
        self.node = _Manager(self, 'node')

    def api(self):
        return self

    def request(self, call, /, *args, before=None, **kwargs):
        if before is not None:  # the adapter runs it before each attempt
            before()
        if self.unavailable:
            raise exception.IronicUnavailable('fake Ironic is down')
        manager, method = call.split('.')
        with ironic.provisioning_errors():
            return getattr(getattr(self, manager), method)(*args, **kwargs)

    def list_nodes(self, conductor_group=None, shards=None, **filters):
        nodes = super().list_nodes(conductor_group, shards)
        for key, value in filters.items():
            if key == 'associated':
                nodes = [n for n in nodes if (n.instance_uuid is not None) == value]
            else:
                nodes = [n for n in nodes if getattr(n, key) == value]
        return nodes

    def set_node(self, uuid, **values):
        self.nodes[uuid] = dataclasses.replace(self.nodes[uuid], **values)

    # allocation.*
    def allocation_create(self, uuid, name, resource_class, traits,
                          candidate_nodes):
        if uuid in self.allocations:
            raise ironic_exc.Conflict(f'allocation {uuid} exists')
        self.created_allocations.append(uuid)
        free = [n for n in candidate_nodes if n in self.nodes
                and self.nodes[n].instance_uuid is None
                and self.nodes[n].provision_state == 'available'
                and self.nodes[n].resource_class == resource_class
                and set(traits or ()) <= self.nodes[n].traits]
        state, node, error = 'error', None, (
            'none of the requested nodes are available and match the '
            f'resource class {resource_class}')
        if free:
            state, node, error = 'active', free[0], None
            self.set_node(node, instance_uuid=uuid)
        self.allocations[uuid] = _Record(uuid=uuid, state=state,
                                         node_uuid=node, last_error=error)
        return self.allocations[uuid]

    def allocation_get(self, uuid):
        if uuid not in self.allocations:
            raise ironic_exc.NotFound(f'no allocation {uuid}')
        return self.allocations[uuid]

    def allocation_delete(self, uuid):
        allocation = self.allocation_get(uuid)
        del self.allocations[uuid]
        node = self.nodes.get(allocation.node_uuid)
        if node is not None and node.instance_uuid == uuid:
            self.set_node(node.uuid, instance_uuid=None)

    # node.*
    def node_get(self, uuid, fields=None):
        if self.on_node_get is not None:
            self.on_node_get(uuid)
        if self._soft_ends.get(uuid, float('inf')) <= time.monotonic():
            del self._soft_ends[uuid]
            self.power_targets.pop(uuid, None)
            self.last_errors[uuid] = 'Timed out waiting for a soft power off'
        return self._record(uuid)

    def _record(self, uuid):
        """The node as Ironic's API shows it."""
        node = self.nodes.get(uuid)
        if node is None:
            raise ironic_exc.NotFound(f'no node {uuid}')
        allocation = next((a.uuid for a in self.allocations.values()
                           if a.node_uuid == uuid), None)
        power_changes, provision_changes = self._changes.get(uuid, (0, 0))
        return _Record(uuid=uuid, provision_state=node.provision_state,
                       target_provision_state=self.targets.get(uuid),
                       instance_uuid=node.instance_uuid,
                       allocation_uuid=allocation,
                       last_error=self.last_errors.get(uuid),
                       maintenance=node.maintenance,
                       power_state=node.power_state,
                       target_power_state=self.power_targets.get(uuid),
                       driver_internal_info={
                           'last_power_state_change': f'p{power_changes}'},
                       provision_updated_at=f'v{provision_changes}',
                       instance_info=dict(self.instance_info.get(uuid, {})),
                       lessee=self.lessees.get(uuid))

    def node_list(self, fields=None, associated=None, conductor_group=None,
                  **filters):
        """One page of nodes as ironicclient lists them (the polls' shared
        listing); ``list_calls`` counts them."""
        self.list_calls = getattr(self, 'list_calls', 0) + 1
        assert not filters, filters
        # Ironic 39 answers a listing asking for it with HTTP 500.
        assert 'allocation_uuid' not in (fields or ()), fields
        return [self.node_get(n.uuid) for n in self.list_nodes(conductor_group)
                if associated is None
                or (n.instance_uuid is not None) == associated]

    def _changed(self, uuid, power=0, provision=0):
        power_changes, provision_changes = self._changes.get(uuid, (0, 0))
        self._changes[uuid] = (power_changes + power,
                               provision_changes + provision)

    def node_set_power_state(self, uuid, state, soft=False, timeout=None):
        if uuid not in self.nodes:
            raise ironic_exc.NotFound(f'no node {uuid}')
        if soft and self.soft_power_refused:
            raise ironic_exc.BadRequest(
                f'the power interface of {uuid} cannot soft {state}')
        if uuid in self.power_targets:
            raise ironic_exc.Conflict(f'node {uuid} is locked')
        self.power_calls.append((uuid, state, soft))
        self.last_errors.pop(uuid, None)  # Ironic clears it as it starts
        self._changed(uuid, power=1)
        target = 'power off' if state == 'off' else 'power on'
        if soft:
            self.soft_timeouts.append(timeout)
        if soft and self.soft_power_ignored:
            # Ironic's own default when no timeout is given is 600 s.
            self.power_targets[uuid] = target
            self._soft_ends[uuid] = time.monotonic() + (timeout or 600)
        elif self.power_hangs:
            self.power_targets[uuid] = target
        else:
            self.set_node(uuid, power_state=target)

    def node_update(self, uuid, patch):
        if uuid not in self.nodes:
            raise ironic_exc.NotFound(f'no node {uuid}')
        self.patches.setdefault(uuid, []).append(patch)
        info = self.instance_info.setdefault(uuid, {})
        for op in patch:
            if op['path'].startswith('/instance_info/'):
                info[op['path'].split('/', 2)[2]] = op['value']
            elif op['path'] == '/lessee' and op['op'] == 'remove':
                self.lessees.pop(uuid, None)
            elif op['path'] == '/lessee':
                self.lessees[uuid] = op['value']
        return self._record(uuid)  # Ironic answers with the node patched

    def node_set_provision_state(self, uuid, target, rescue_password=None,
                                 configdrive=None):
        self.provision_calls.append((uuid, target))
        if configdrive is not None:
            if target not in ('active', 'rebuild'):
                raise ironic_exc.BadRequest(
                    'Adding a config drive is only supported when setting '
                    'provision state to active, rebuild')
            self.configdrives.append((uuid, target, configdrive))
        if uuid not in self.nodes:
            raise ironic_exc.NotFound(f'no node {uuid}')
        node = self.nodes[uuid]
        if target in ('rescue', 'unrescue'):
            return self._rescue(uuid, node, target, rescue_password)
        self._changed(uuid, provision=1)
        if target == 'active':
            if node.provision_state != 'available':
                raise ironic_exc.BadRequest(f'node {uuid} is {node.provision_state}')
            if self.deploy_hangs:
                self.targets[uuid] = 'active'
                self.set_node(uuid, provision_state='deploying')
            else:
                self.set_node(uuid, provision_state='deploy failed'
                              if self.deploy_fails else 'active')
        elif target == 'rebuild':
            if node.provision_state != 'active':
                raise ironic_exc.BadRequest(f'node {uuid} is {node.provision_state}')
            if self.deploy_hangs:
                self.targets[uuid] = 'active'
                self.set_node(uuid, provision_state='deploying')
        elif target == 'deleted':
            if uuid in self.targets:
                raise ironic_exc.Conflict(f'node {uuid} is locked')
            # Undeploy and clean: Ironic drops the allocation itself.
            for allocation in [a for a in self.allocations.values()
                               if a.node_uuid == uuid]:
                del self.allocations[allocation.uuid]
            self.set_node(uuid, provision_state='available', instance_uuid=None)
        else:
            raise ironic_exc.BadRequest(f'unknown target {target}')

    def _rescue(self, uuid, node, target, password):
        """Ironic's rescue and unrescue (API 1.38), as fake hardware does
        them: at once, or ``rescue_hangs`` (a ramdisk that never calls
        back: "rescue wait"), or ``rescue_fails``."""
        allowed = (('active', 'rescue', 'rescue failed') if target == 'rescue'
                   else ('rescue', 'rescue failed', 'unrescue failed'))
        if node.provision_state not in allowed or uuid in self.targets:
            raise ironic_exc.BadRequest(
                f'cannot {target} node {uuid} in {node.provision_state}')
        if target == 'rescue' and not (password and password.strip()):
            raise ironic_exc.BadRequest('a non-empty rescue_password is '
                                        'required')
        self._changed(uuid, provision=1)
        if target == 'rescue':
            self.rescue_passwords.append(password)
        if self.rescue_hangs:
            self.targets[uuid] = 'rescue'
            self.set_node(uuid, provision_state='rescue wait')
        elif self.rescue_fails:
            self.set_node(uuid, provision_state=f'{target} failed')
        else:
            self.set_node(uuid, provision_state='rescue' if target == 'rescue'
                          else 'active')

    def node_set_console_mode(self, uuid, enabled):
        self._record(uuid)  # 404 for a node that is gone
        self.console_calls.append((uuid, enabled))
        self.consoles[uuid] = bool(enabled)

    def node_get_console(self, uuid):
        self._record(uuid)
        enabled = self.consoles.get(uuid, False)
        return {'console_enabled': enabled, 'console_info': {
            'type': 'socat', 'url': 'tcp://192.0.2.1:8023'} if enabled
            else None}

    @property
    def rescue_passwords(self):
        """Every rescue_password a rescue was sent with."""
        return self.__dict__.setdefault('_rescue_passwords', [])

    @property
    def consoles(self):
        """node uuid -> whether its console is enabled."""
        return self.__dict__.setdefault('_consoles', {})

    @property
    def console_calls(self):
        """Every (node, enabled) set_console_mode was sent."""
        return self.__dict__.setdefault('_console_calls', [])

    @property
    def instance_info(self):
        """node uuid -> the instance_info its patches set."""
        return self.__dict__.setdefault('_instance_info', {})

    @property
    def lessees(self):
        """node uuid -> its lessee (absent: none)."""
        return self.__dict__.setdefault('_lessees', {})

    @property
    def patches(self):
        return self.__dict__.setdefault('_patches', {})

    @property
    def configdrives(self):
        """Every (node, target, configdrive) a deploy or rebuild was sent
        with a config drive."""
        return self.__dict__.setdefault('_configdrives', [])

    @property
    def provision_calls(self):
        """Every (node, target) set_provision_state was sent."""
        return self.__dict__.setdefault('_provision_calls', [])


class _Manager:
    def __init__(self, fake, prefix):
        self._fake, self._prefix = fake, prefix

    def __getattr__(self, name):
        return getattr(self._fake, f'{self._prefix}_{name}')
