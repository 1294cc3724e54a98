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

"""A Placement held in memory, at the keystoneauth Adapter boundary.

``FakePlacement.request(url, method, **kwargs)`` answers as a keystoneauth
``Adapter`` with ``raise_exc=False`` would, with the behaviour measured on
openstack-placement 16.0.0 (see doc/placement.md): custom resource classes
and traits must exist before use, every write names the provider's
generation (409 ``placement.concurrent_update`` otherwise), an identical
inventory or aggregates PUT still bumps the generation (an identical traits
PUT does not), a provider or an inventory in use cannot be deleted, a
duplicate uuid or name is 409. For the unit tests and the benchmarks: it
counts the requests (``requests``: (method, path) in order) and lets a test
intervene before any (``before``).
"""

import copy
import json
import urllib.parse


class Response:
    def __init__(self, status_code, body=None):
        self.status_code = status_code
        self.content = b'' if body is None else json.dumps(body).encode()
        self.text = self.content.decode()

    def json(self):
        return json.loads(self.content)


def _error(status, code='placement.undefined_code', detail=''):
    return Response(status, {'errors': [{'status': status, 'code': code,
                                         'detail': detail}]})


class FakePlacement:
    """The providers, classes, traits and allocations of one Placement."""

    def __init__(self):
        self.providers = {}  # uuid -> {name, generation, inventories, traits, aggregates}
        self.classes = set()  # custom resource classes
        self.traits = set()  # custom traits
        self.allocations = {}  # consumer uuid -> {provider uuid: resources}
        self.consumer_generations = {}  # consumer uuid -> generation
        self.owners = {}  # consumer uuid -> (project_id, user_id)
        self.requests = []  # (method, path)
        # before(method, path): called before each answer; what it raises
        # reaches the client (e.g. keystoneauth's ConnectFailure), what it
        # returns (a Response), when not None, is the answer.
        self.before = None

    # -- what tests set up and look at

    def add_provider(self, uuid, name=None, traits=(), aggregates=()):
        self.traits.update(t for t in traits if t.startswith('CUSTOM_'))
        self.providers[uuid] = {'name': name or uuid, 'generation': 0,
                                'inventories': {}, 'traits': set(traits),
                                'aggregates': set(aggregates)}
        return self.providers[uuid]

    def bump(self, uuid):
        """Someone else wrote to the provider."""
        self.providers[uuid]['generation'] += 1

    def allocate(self, consumer, uuid, resource_class, amount=1):
        self.allocations.setdefault(consumer, {})[uuid] = {resource_class: amount}
        self.bump(uuid)

    def writes(self):
        return [r for r in self.requests if r[0] != 'GET']

    # -- the Adapter

    def request(self, url, method, json=None, **kwargs):
        parsed = urllib.parse.urlsplit(url)
        path = parsed.path
        self.requests.append((method, url))
        if self.before is not None:
            answer = self.before(method, url)
            if answer is not None:
                return answer
        parts = [p for p in path.split('/') if p]
        query = urllib.parse.parse_qs(parsed.query)
        if not parts:
            return Response(200, {'versions': [{'id': 'v1.0', 'max_version': '1.39',
                                                'min_version': '1.0'}]})
        if parts[0] == 'resource_classes' and method == 'PUT':
            new = parts[1] not in self.classes
            self.classes.add(parts[1])
            return Response(201 if new else 204)
        if parts[0] == 'traits' and method == 'PUT':
            new = parts[1] not in self.traits
            self.traits.add(parts[1])
            return Response(201 if new else 204)
        if parts[0] == 'resource_providers':
            return self._providers(method, parts[1:], query, json)
        if parts[0] == 'allocation_candidates':
            return self._candidates(query)
        if parts[0] == 'allocations':
            return self._allocations(method, parts[1], json)
        if parts[0] == 'reshaper' and method == 'POST':
            return self._reshape(json)
        return _error(404)

    def _reshape(self, body):
        """The inventories, then the new consumers' allocations, all or
        nothing (what this service sends: see client.reshape)."""
        saved = copy.deepcopy((self.providers, self.allocations,
                               self.consumer_generations, self.owners))
        answers = [self._providers('PUT', [uuid, 'inventories'], {}, change)
                   for uuid, change in body['inventories'].items()]
        answers += [self._allocations('PUT', consumer, change)
                    for consumer, change in body['allocations'].items()]
        failed = [a for a in answers if a.status_code >= 400]
        if failed:
            (self.providers, self.allocations, self.consumer_generations,
             self.owners) = saved
            return failed[0]
        return Response(204)

    def used(self, uuid, resource_class):
        return sum(a.get(uuid, {}).get(resource_class, 0)
                   for a in self.allocations.values())

    def _candidates(self, query):
        resource_class, amount = query['resources'][0].split(':')
        required = set(query['required'][0].split(',')) if 'required' in query else set()
        member_of = query.get('member_of', [None])[0]
        found = []
        for uuid, rp in self.providers.items():
            inventory = rp['inventories'].get(resource_class)
            if (inventory is None or not required <= rp['traits']
                    or (member_of and member_of not in rp['aggregates'])):
                continue
            if (inventory['total'] - inventory['reserved']
                    - self.used(uuid, resource_class) >= int(amount)):
                found.append({'allocations': {uuid: {'resources': {
                    resource_class: int(amount)}}}})
        return Response(200, {'allocation_requests': found, 'provider_summaries': {}})

    def _allocations(self, method, consumer, body):
        held = self.allocations.get(consumer)
        generation = self.consumer_generations.get(consumer)
        if method == 'GET':
            return Response(200, {} if held is None else {
                'allocations': {u: {'resources': r} for u, r in held.items()},
                'consumer_generation': generation})
        if method == 'DELETE':
            if held is None:
                return _error(404)
            del self.allocations[consumer]
            self.consumer_generations.pop(consumer, None)
            for uuid in held:
                self.bump(uuid)
            return Response(204)
        if body['consumer_generation'] != generation:
            return _error(409, 'placement.concurrent_update',
                          'consumer generation conflict')
        wanted = {u: a['resources'] for u, a in body['allocations'].items()}
        for uuid, resources in wanted.items():
            rp = self.providers.get(uuid)
            if rp is None:
                return _error(400)
            for resource_class, amount in resources.items():
                inventory = rp['inventories'].get(resource_class)
                mine = (held or {}).get(uuid, {}).get(resource_class, 0)
                if inventory is None or (inventory['total'] - inventory['reserved']
                                         - self.used(uuid, resource_class) + mine
                                         < amount):
                    return _error(409, detail='Unable to allocate inventory')
        self.allocations[consumer] = wanted
        self.owners[consumer] = (body['project_id'], body['user_id'])
        self.consumer_generations[consumer] = (generation or 0) + 1
        for uuid in wanted:
            self.bump(uuid)
        return Response(204)

    def _providers(self, method, parts, query, body):
        if not parts:
            if method == 'GET':
                wanted = None
                if 'member_of' in query:
                    wanted = set(query['member_of'][0].removeprefix('in:').split(','))
                return Response(200, {'resource_providers': [
                    {'uuid': u, 'name': p['name'], 'generation': p['generation']}
                    for u, p in self.providers.items()
                    if wanted is None or p['aggregates'] & wanted]})
            uuid, name = body['uuid'], body['name']
            if uuid in self.providers:
                return _error(409, 'placement.duplicate_uuid')
            if any(p['name'] == name for p in self.providers.values()):
                return _error(409, 'placement.duplicate_name')
            self.add_provider(uuid, name)
            return Response(200, {'uuid': uuid, 'name': name, 'generation': 0})
        uuid = parts[0]
        rp = self.providers.get(uuid)
        if rp is None:
            return _error(404)
        used = {rc for allocs in self.allocations.values()
                for rc in allocs.get(uuid, {})}
        if len(parts) == 1:
            if method == 'DELETE':
                if used:
                    return _error(409, 'placement.resource_provider.inuse')
                del self.providers[uuid]
                return Response(204)
            return Response(200, {'uuid': uuid, 'name': rp['name'],
                                  'generation': rp['generation']})
        what = parts[1]
        if method == 'GET':
            if what == 'allocations':
                return Response(200, {'resource_provider_generation': rp['generation'],
                                      'allocations': {
                                          c: {'resources': a[uuid]}
                                          for c, a in self.allocations.items()
                                          if uuid in a}})
            value = rp[what]
            return Response(200, {'resource_provider_generation': rp['generation'],
                                  what: value if isinstance(value, dict)
                                  else sorted(value)})
        if body['resource_provider_generation'] != rp['generation']:
            return _error(409, 'placement.concurrent_update')
        if what == 'inventories':
            unknown = [rc for rc in body['inventories']
                       if rc.startswith('CUSTOM_') and rc not in self.classes]
            if unknown:
                return _error(400, detail=f'No such resource class {unknown[0]}')
            if used - set(body['inventories']):
                return _error(409, 'placement.inventory.inuse')
            rp['inventories'] = {rc: dict(inv) for rc, inv in body['inventories'].items()}
            rp['generation'] += 1
        elif what == 'traits':
            unknown = [t for t in body['traits']
                       if t.startswith('CUSTOM_') and t not in self.traits]
            if unknown:
                return _error(400, detail=f'No such trait(s): {unknown[0]}')
            if set(body['traits']) != rp['traits']:
                rp['traits'] = set(body['traits'])
                rp['generation'] += 1
        elif what == 'aggregates':
            rp['aggregates'] = set(body['aggregates'])
            rp['generation'] += 1
        else:
            return _error(404)
        value = rp[what]
        return Response(200, {'resource_provider_generation': rp['generation'],
                              what: value if isinstance(value, dict) else sorted(value)})
