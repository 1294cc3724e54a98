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

"""Placement (optional): every node a service owns reported as a resource
provider, as Nova's ironic driver reports it, and never re-created or
deleted by a rebalance.

``provider.py`` (pure: what a node's provider should hold), ``client.py``
(the only module that speaks HTTP to Placement; its errors translated once)
and ``sync.py`` (what the resource tracker calls each cycle: writes only what
changed, by the owner of the node's row).
"""
