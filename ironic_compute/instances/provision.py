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

"""Reserve, deploy and tear down Ironic nodes for instances (the adapter).

Thin: each method is one Ironic request (with the adapter's retries), or a
poll of one node or allocation until it leaves a transitional state. A
request that changes anything takes a ``fence``: a callable run immediately
before it is sent, which raises Fenced when the caller may no longer act
(the flow's fencing.Fence decides; nothing here reads the database). The
reservation is an Ironic allocation whose uuid *and* name are the
instance's uuid: a second request for the same instance (a daemon killed
mid-build, a host that took the build over) finds the allocation made by
the first instead of reserving a second node, and the node's
``instance_uuid`` is the instance's uuid, so every service sees whose node
it is.
"""

import dataclasses
import threading

from ironic_compute import exception
from ironic_compute import redaction
from ironic_compute.instances import answers
from ironic_compute.instances import polls
from ironic_compute.text import one_line


class Provisioner(polls.NodePolls):
    """The provisioning steps of a build, an action or a teardown, each one
    request (a change, fenced) or a wait on a node."""

    def __init__(self, ironic_client, conductor_group=None, **kwargs):
        super().__init__(ironic_client, conductor_group=conductor_group,
                         **kwargs)
        # The free nodes of each (conductor group, resource class), one
        # listing at a time shared by the builds that ask meanwhile.
        self._free_reads = {}
        self._free_lock = threading.Lock()

    def free_nodes(self, conductor_group, resource_class):
        """The nodes a build may reserve now, fresh from Ironic: from a
        listing that started after the call, shared with the builds of this
        service that ask while it runs (SharedRead)."""
        self._worker.last = None  # a request about other nodes
        key = (conductor_group, resource_class)
        with self._free_lock:
            read = self._free_reads.get(key)
            if read is None:
                read = self._free_reads[key] = polls.SharedRead(
                    lambda: self._list_free(conductor_group, resource_class))
        return list(read())

    def _list_free(self, conductor_group, resource_class):
        with self.turn('cannot list free nodes'):
            return self._ironic.list_nodes(
                conductor_group=conductor_group,
                resource_class=resource_class, provision_state='available',
                associated=False, maintenance=False)

    def allocation(self, uuid):
        try:
            raw = self._request('cannot read allocation', 'allocation.get',
                                uuid)
        except exception.IronicNotFound:
            return None
        if raw.state == 'active' and raw.node_uuid:
            # Ironic writes an allocation's node together with that node's
            # instance_uuid (the allocation's uuid) and allocation, and
            # drops the allocation when instance_uuid is removed: the
            # answer says whom the node serves.
            self._heard(answers.Serving(raw.node_uuid, raw.uuid, raw.uuid))
        return answers.Allocation(raw.uuid, raw.state, raw.node_uuid,
                          redaction.url_credentials(raw.last_error))

    def allocate(self, instance_uuid, spec, candidates, timeout, fence,
                 absent=False):
        """Reserve one of ``candidates`` for the instance; the answers.Allocation.

        Finds the allocation of an earlier attempt instead of making a
        second one (``absent``: the caller has just read that there is
        none, and it is not read again; a create that finds one made
        meanwhile still takes it). Returns once it is no longer
        ``allocating``.
        """
        existing = None if absent else self.allocation(instance_uuid)
        created = None
        if existing is None:
            try:
                created = self._change(
                    fence, 'cannot reserve a node', 'allocation.create',
                    uuid=instance_uuid, name=instance_uuid,
                    resource_class=spec.resource_class,
                    traits=sorted(spec.traits) or None,
                    candidate_nodes=list(candidates),
                    landed=lambda before: (
                        lambda: self.allocation(instance_uuid),
                        lambda found: found is not None))
            except exception.ProvisionError:
                # Made by another attempt between our read and our create.
                if self.allocation(instance_uuid) is None:
                    raise
        # Ironic answers the create before its conductor allocates: a read
        # at once would find the "allocating" the answer says.
        allocating = getattr(created, 'state', None) == 'allocating'
        done = self.poll(lambda: self.allocation(instance_uuid),
                         lambda a: a is None or a.state != 'allocating',
                         timeout, f'allocation {instance_uuid}',
                         first_read=self.poll_interval if allocating else None)
        if done is not None and created is not None:
            done = dataclasses.replace(done, created=True)
        return done

    def delete_allocation(self, uuid, fence):
        """Remove the allocation if there is one (a 404 is success)."""
        try:
            self._change(fence, 'cannot remove allocation',
                         'allocation.delete', uuid,
                         landed=lambda before: (
                             lambda: self.allocation(uuid),
                             lambda found: found is None))
        except exception.IronicNotFound:
            pass

    def _landed_on_node(self, node, took):
        """``landed`` for a change of ``node``: read it anew, ``took(state)``
        (a node gone from Ironic counts as taken: nothing is sent to it
        again, and the caller's next read says it is gone)."""
        return (lambda: self.node(node),
                lambda state: state is None or took(state))

    def _patch_instance_info(self, node, values, fence, what, lessee=None):
        """Set ``values`` in the node's instance_info (and its lessee, if
        given: Ironic API 1.65); a lost answer is decided by reading them
        back."""
        patch = [{'op': 'add', 'path': f'/instance_info/{key}', 'value': value}
                 for key, value in values.items()]
        if lessee is not None:
            patch.append({'op': 'add', 'path': '/lessee', 'value': lessee})
        self._change(fence, what, 'node.update', node, patch,
                     landed=lambda before: (
                         lambda: self._instance_info(node, lessee is not None),
                         lambda read: read is None or (all(
                             read[0].get(key) == value
                             for key, value in values.items())
                             and (lessee is None or read[1] == lessee))))

    def _instance_info(self, node, lessee=False):
        """(the node's instance_info, its lessee: None unless ``lessee``),
        or None when the node is gone. Never logged: it may carry what a
        tenant gave."""
        fields = ['uuid', 'instance_info', *(['lessee'] if lessee else [])]
        try:
            raw = self._request('cannot read node', 'node.get', node,
                                fields=fields)
        except exception.IronicNotFound:
            return None
        return (dict(getattr(raw, 'instance_info', None) or {}),
                getattr(raw, 'lessee', None) if lessee else None)

    def deploy(self, node, info, fence, lessee=None, configdrive=None):
        """Give the node ``info`` (its instance_info: inst.deploy_info) and
        ``lessee`` (a project; None: left as it is) in one patch, then deploy
        it with ``configdrive`` (Ironic builds the drive, API 1.56; or None)."""
        self._patch_instance_info(node, info, fence, 'cannot set the image',
                                  lessee=lessee)
        # Taken once the node left "available" or has a target.
        _with_drive(self, fence, 'cannot deploy', node, 'active', configdrive,
                    landed=lambda before: self._landed_on_node(
                        node, lambda state: state.target_provision_state
                        is not None or state.provision_state != 'available'))

    def clear_lessee(self, node, fence):
        """Remove the node's lessee; a lost answer is decided by reading
        the lessee back (gone: taken)."""
        self._change(fence, 'cannot clear the lessee', 'node.update', node,
                     [{'op': 'remove', 'path': '/lessee'}],
                     landed=lambda before: (
                         lambda: self._instance_info(node, lessee=True),
                         lambda read: read is None or read[1] is None))

    def undeploy(self, node, fence):
        """Tear the node down (undeploy and clean)."""
        self._change(fence, 'cannot tear down', 'node.set_provision_state',
                     node, 'deleted', landed=lambda before: self._landed_on_node(
                         node, lambda state: state.target_provision_state
                         is not None
                         or state.provision_state not in answers.UNDEPLOYABLE))

    def set_power(self, node, target, fence, soft=False, timeout=None):
        """Ask Ironic to power the node ``target`` ('on', 'off', 'reboot'),
        gracefully if ``soft``; a soft action that has not ended after
        ``timeout`` seconds is ended by Ironic itself (as failed)."""
        extra = {'timeout': max(int(timeout), 1)} if soft and timeout else {}
        self._change(fence, f'cannot {"soft " if soft else ""}{target}',
                     'node.set_power_state', node, target, soft=soft,
                     landed=lambda before: self._power_landed(
                         node, target, before), **extra)

    def _power_landed(self, node, target, before):
        """``landed`` for a power call: a power action under way, or the
        node in the power asked for; for a reboot (which ends where it
        began) Ironic's record of when it last began a power action must
        have moved since ``before``, the node as the fence checked it
        before the send (None, unknown: undecided)."""
        if target == 'reboot':
            if before is None:
                return None
            return self._landed_on_node(
                node, lambda state: state.target_power_state is not None
                or state.last_power_state_change
                != before.last_power_state_change)
        wanted = answers.POWER_ON if target == 'on' else answers.POWER_OFF
        return self._landed_on_node(
            node, lambda state: state.target_power_state is not None
            or state.power_state == wanted)

    def wait_for_power_settled(self, node, timeout, what, interval=None):
        """Poll the node until no power action is in flight; the node."""
        state = self.poll_node(
            node, lambda n: n is None or n.target_power_state is None,
            timeout, what, interval)
        if state is None:
            raise exception.ProvisionError(f'{what}: node {node} is gone from Ironic')
        return state

    def rebuild(self, node, image_source, fence, current_image=None, configdrive=None):
        """Redeploy the node in place (same node, same allocation) with
        ``configdrive`` (as deploy()) and ``image_source``, patched into
        instance_info unless ``current_image`` (the node's, just read) is it."""
        if current_image != image_source:
            self._patch_instance_info(node, {'image_source': image_source},
                                      fence, 'cannot set the image')
        _with_drive(self, fence, 'cannot rebuild', node, 'rebuild',
                    configdrive, landed=lambda before: None if (
                        before is None) else self._landed_on_node(
                        # A rebuild ends in "active", where it began: its
                        # provision state must have changed since.
                        node, lambda state: state.target_provision_state
                        is not None or state.provision_state != answers.DEPLOY_DONE
                        or state.provision_updated_at
                        != before.provision_updated_at))

    def rescue(self, node, fence, password=None):
        """Rescue the node (login ``password``), or (None) unrescue it."""
        verb = 'rescue' if password is not None else 'unrescue'
        extra = {} if password is None else {'rescue_password': password}
        self._change(fence, f'cannot {verb}', 'node.set_provision_state',
                     node, verb, landed=_provision_moved(self, node), **extra)

    def wait_for_power(self, node, power_state, timeout, what,
                       interval=None, first_read=None):
        """Poll the node (every ``interval`` s at first, None: the builds';
        ``first_read``: poll()'s) until Ironic says ``power_state`` with no
        power action in flight; exception.ProvisionError when time is up."""
        state = self.poll_node(
            node, lambda n: n is None or (n.target_power_state is None
                                          and n.power_state == power_state),
            timeout, what, interval, first_read=first_read)
        if state is None:
            raise exception.ProvisionError(f'{what}: node {node} is gone from Ironic')
        return state

    def wait_for(self, node, done, failed, timeout, what, interval=None, first_read=None):
        """Poll the node (poll_node()) until it reaches ``done``;
        exception.ProvisionError if it reaches one of ``failed`` or time is up."""
        state = self.poll_node(
            node, lambda n: n is None or (n.target_provision_state is None and (
                n.provision_state == done or n.provision_state in failed)),
            timeout, what, interval, first_read)
        if state is None:
            raise exception.ProvisionError(f'{what}: node {node} is gone from Ironic')
        if state.provision_state != done:
            raise exception.ProvisionError(
                f'{what}: node {node} is {state.provision_state}'
                + (f': {one_line(state.last_error)}'
                   if state.last_error else ''))
        return state


def _with_drive(provisioner, fence, what, node, target, configdrive, landed):
    """Ask Ironic for provision state ``target`` (a deploy, a rebuild) with
    ``configdrive``, or with no config drive at all when it is None (what
    Ironic got before there were config drives); an error never quotes
    its user data. Returns what Provisioner._change() returns."""
    extra = {'configdrive': configdrive} if configdrive else {}
    with redaction.secret_kept_out((configdrive or {}).get('user_data')):
        return provisioner._change(fence, what, 'node.set_provision_state',
                                   node, target, landed=landed, **extra)


def _provision_moved(provisioner, node):
    """``landed`` for a rescue or an unrescue: a provision action under
    way on ``node``, or its provision_updated_at moved since ``before``,
    the node as the fence checked it (None: undecided)."""
    return lambda before: None if before is None else (
        provisioner._landed_on_node(
            node, lambda state: state.target_provision_state is not None
            or state.provision_updated_at != before.provision_updated_at))
