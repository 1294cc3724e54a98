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

"""The Placement report client: the one module that speaks HTTP to Placement.

A thin layer over a keystoneauth ``Adapter`` built from ``[placement]``:
every request names its microversion, and an answer other than success is
translated here, once, into this module's errors. Nothing here retries or
decides; ``sync.py`` does. Tokens and passwords are never logged: only the
endpoint and the auth type are.
"""

import threading
import urllib.parse

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.conf import placement as placement_conf
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

GROUP = 'placement'
# The highest microversion any request sends, and what it brings:
# 1.20 (POST /resource_providers returns the provider), 1.19 (aggregates
# with the provider generation), 1.26 (reserved may equal total), 1.28
# (consumer generations), 1.38 (consumer_type, mandatory from then on).
MICROVERSION = '1.38'


def configured(conf):
    """Whether ``[placement]`` names an auth type: without one, no request
    is ever sent (conf/placement.py says it)."""
    return placement_conf.configured(conf)


def _error(response, method, url):
    try:
        body = response.json()
        first = (body.get('errors') or [{}])[0]
        detail, code = first.get('detail') or '', first.get('code')
    except ValueError:
        detail, code = response.text, None
    message = one_line(f'{method} {url}: HTTP {response.status_code}: '
                       f'{detail}', 300)
    status = response.status_code
    if status == 404:
        return exception.PlacementNotFound(message, status, code)
    if status == 409:
        return exception.PlacementConflict(message, status, code)
    if status in (401, 403) or status >= 500:
        return exception.PlacementUnavailable(message, status, code)
    return exception.PlacementRefused(message, status, code)


class PlacementClient:
    """Requests to Placement through one lazily built Adapter."""

    def __init__(self, conf, adapter=None):
        self._conf = conf
        self._adapter = adapter  # injectable for unit tests
        self._lock = threading.Lock()

    def _get_adapter(self):
        with self._lock:
            if self._adapter is None:
                self._adapter = self._build()
            return self._adapter

    def _build(self):
        opts = self._conf[GROUP]
        try:
            auth = ks_loading.load_auth_from_conf_options(self._conf, GROUP)
            session = ks_loading.load_session_from_conf_options(
                self._conf, GROUP, auth=auth)
            adapter = ks_loading.load_adapter_from_conf_options(
                self._conf, GROUP, session=session, auth=auth)
        except ks_exc.ClientException as exc:
            raise exception.PlacementConfigError(
                f'invalid [placement] options: {one_line(exc, 300)}') from exc
        # Never the options wholesale: they hold tokens and passwords.
        LOG.info('Reporting to Placement at %(endpoint)s (auth_type '
                 '%(auth_type)s, microversion %(version)s)',
                 {'endpoint': opts.endpoint_override
                  or getattr(auth, 'endpoint', None) or 'catalog endpoint',
                  'auth_type': opts.auth_type, 'version': MICROVERSION})
        return adapter

    def request(self, method, url, body=None, version=MICROVERSION):
        """The decoded JSON answer (None when empty); else the
        exception.Placement* error of the answer."""
        adapter = self._get_adapter()
        kwargs = {'microversion': version, 'raise_exc': False,
                  'headers': {'Accept': 'application/json'}}
        if body is not None:
            kwargs['json'] = body
        try:
            response = adapter.request(url, method, **kwargs)
        except ks_exc.ClientException as exc:
            # Connection refused or reset, timeout, no endpoint in the
            # catalog, Keystone down: keystoneauth's messages hold no secret.
            raise exception.PlacementUnavailable(
                f'{method} {url}: {one_line(exc, 300)}') from exc
        if response.status_code >= 400:
            raise _error(response, method, url)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    # The calls sync.py makes, one request each.

    def root(self):
        """``GET /``: the versions document (no microversion needed)."""
        return self.request('GET', '/', version=None)

    def max_microversion(self):
        """(major, minor) of the highest microversion Placement serves."""
        versions = (self.root() or {}).get('versions') or [{}]
        major, minor = str(versions[0].get('max_version', '1.0')).split('.')
        return int(major), int(minor)

    def list_providers(self, member_of=None):
        """{uuid: generation} of the providers (``member_of``: any of these
        aggregates)."""
        url = '/resource_providers'
        if member_of:
            url += '?member_of=in:' + ','.join(sorted(member_of))
        found = self.request('GET', url) or {}
        return {p['uuid']: p['generation']
                for p in found.get('resource_providers', ())}

    def create_provider(self, uuid, name):
        """The new provider's generation (Conflict when the uuid or the
        name exists)."""
        created = self.request('POST', '/resource_providers',
                               {'uuid': uuid, 'name': name})
        return created['generation']

    def delete_provider(self, uuid):
        self.request('DELETE', f'/resource_providers/{uuid}')

    def get_inventories(self, uuid):
        """(generation, {resource class: record}); PlacementNotFound when there is
        no such provider."""
        found = self.request('GET', f'/resource_providers/{uuid}/inventories')
        return found['resource_provider_generation'], found['inventories']

    def put_inventories(self, uuid, generation, inventories):
        """The provider's new generation."""
        done = self.request(
            'PUT', f'/resource_providers/{uuid}/inventories',
            {'resource_provider_generation': generation,
             'inventories': inventories})
        return done['resource_provider_generation']

    def get_traits(self, uuid):
        found = self.request('GET', f'/resource_providers/{uuid}/traits')
        return found['resource_provider_generation'], frozenset(found['traits'])

    def put_traits(self, uuid, generation, traits):
        done = self.request(
            'PUT', f'/resource_providers/{uuid}/traits',
            {'resource_provider_generation': generation,
             'traits': sorted(traits)})
        return done['resource_provider_generation']

    def get_aggregates(self, uuid):
        found = self.request('GET', f'/resource_providers/{uuid}/aggregates')
        return (found['resource_provider_generation'],
                frozenset(found['aggregates']))

    def put_aggregates(self, uuid, generation, aggregates):
        done = self.request(
            'PUT', f'/resource_providers/{uuid}/aggregates',
            {'resource_provider_generation': generation,
             'aggregates': sorted(aggregates)})
        return done['resource_provider_generation']

    def provider_allocations(self, uuid):
        """{consumer uuid: resources} of the allocations on the provider."""
        found = self.request('GET', f'/resource_providers/{uuid}/allocations')
        return found.get('allocations') or {}

    def allocation_candidates(self, resource_class, traits=(), member_of=None):
        """The uuids of the providers that can take one unit of
        ``resource_class``, have every trait of ``traits`` and are in the
        aggregate ``member_of`` (None: any), in Placement's order."""
        query = [('resources', f'{resource_class}:1')]
        if traits:
            query.append(('required', ','.join(sorted(traits))))
        if member_of:
            query.append(('member_of', member_of))
        found = self.request(
            'GET', '/allocation_candidates?' + urllib.parse.urlencode(query))
        uuids = []
        for request in found.get('allocation_requests', ()):
            for uuid in request['allocations']:
                if uuid not in uuids:
                    uuids.append(uuid)
        return uuids

    def get_allocations(self, consumer):
        """(consumer generation or None, {provider uuid: resources})."""
        found = self.request('GET', f'/allocations/{consumer}') or {}
        return (found.get('consumer_generation'),
                {uuid: a['resources']
                 for uuid, a in (found.get('allocations') or {}).items()})

    def put_allocations(self, consumer, allocations, project_id, user_id,
                        consumer_generation=None, consumer_type='INSTANCE'):
        """``allocations``: {provider uuid: {resource class: amount}}.
        ``consumer_generation`` None: the consumer must be new."""
        self.request('PUT', f'/allocations/{consumer}', {
            'allocations': {uuid: {'resources': resources}
                            for uuid, resources in allocations.items()},
            'project_id': project_id, 'user_id': user_id,
            'consumer_generation': consumer_generation,
            'consumer_type': consumer_type})

    def delete_allocations(self, consumer):
        self.request('DELETE', f'/allocations/{consumer}')

    def reshape(self, inventories, allocations, consumer_type='INSTANCE'):
        """``POST /reshaper`` (1.30; Placement's service role): in one
        transaction, ``inventories`` {provider uuid: (generation, {resource
        class: record})} and the allocations of new consumers
        ``allocations`` {consumer: ({provider uuid: {resource class:
        amount}}, project_id, user_id)}."""
        self.request('POST', '/reshaper', {
            'inventories': {
                uuid: {'resource_provider_generation': generation,
                       'inventories': records}
                for uuid, (generation, records) in inventories.items()},
            'allocations': {
                consumer: {'allocations': {uuid: {'resources': resources}
                                           for uuid, resources in held.items()},
                           'project_id': project_id, 'user_id': user_id,
                           'consumer_generation': None,
                           'consumer_type': consumer_type}
                for consumer, (held, project_id, user_id)
                in allocations.items()}})

    def ensure_resource_class(self, name):
        """``PUT /resource_classes/{name}``: creates a custom class, or
        does nothing when it exists."""
        self.request('PUT', f'/resource_classes/{name}')

    def ensure_trait(self, name):
        """``PUT /traits/{name}``: creates a custom trait, or nothing."""
        self.request('PUT', f'/traits/{name}')
