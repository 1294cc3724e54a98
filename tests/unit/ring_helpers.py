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

"""What the ring tests (test_hash_ring, test_assignment) share."""

import json
import os
import pathlib
import random
import subprocess
import sys
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[2]


def random_keys(seed, count):
    """``count`` uuid4 strings drawn from a generator seeded with ``seed``:
    the same keys on every run."""
    rng = random.Random(seed)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def run_in_another_process(code, data, hashseed):
    """What ``code`` prints as JSON, run by a fresh Python with
    PYTHONHASHSEED=``hashseed`` and ``data`` as JSON on its stdin: a ring
    must not depend on the process' hash seed."""
    env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, '-c', code], input=json.dumps(data),
                         capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    return json.loads(out.stdout)
