#!/usr/bin/env python3
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

"""Where an instance action's time goes, read from a bench run's logs.

``tools/bench_instances.py`` leaves its state directory (it prints it:
``logs: /tmp/bench-instances-XXXX/...``) with the services' logs and
Ironic's. For each action the services logged done (``Instance U:
rebooting done``), this finds in Ironic's API log the service's read of
the node before its call, the call (the last PUT on the node before it
was done) and the conductor's end of it, and prints the medians of each
part, side by side for the four actions:

* the read: how long Ironic took to answer the read before the call;
* read to call: the service's own work between them (the database);
* the call: how long Ironic took to answer it;
* Ironic's end: from the call's answer to the conductor's log line that
  the power action or the deploy ended;
* seen done: from that line to the service's "done" (its polls' lag);
* read to done: the whole of it, from the read's start.

And, per burst of each action, how far apart the reads began: the
actions of a burst waiting for a turn (``max_concurrent_ironic_requests``)
spread them. The times are those of the two logs, on the same clock.
What it does not see is the time from the request to the read (the
queue's read, then the turn): the bench's own figures include it.

    python tools/trace_actions.py /tmp/bench-instances-XXXX
"""

import argparse
import datetime
import glob
import os
import re
import statistics
import sys

ACTIONS = ('powering-off', 'powering-on', 'rebooting', 'rebuilding')
PARTS = (('the read', lambda r: r['read_took']),
         ('read to call', lambda r: r['call_start'] - r['read_end']),
         ('the call', lambda r: r['call_took']),
         ("Ironic's end", lambda r: r['ended'] - r['call_end']),
         ('seen done', lambda r: r['done'] - r['ended']),
         ('read to done', lambda r: r['done'] - r['read_start']))
NODE_REQUEST = re.compile(
    r'(GET|PUT) /v1/nodes/([0-9a-f-]{36})(\S*) .*\((\d+\.\d+)ms\)')
ENDED = re.compile(r'(?:Successfully set node|Successfully deployed node) (\S+)')
DONE = re.compile(r'Instance (\S+): (\S+) done')
ACTIVE = re.compile(r'Instance (\S+): active on node (\S+)')
BURST_GAP = 2.0  # seconds between two reads that begin two bursts


def _time(line):
    return datetime.datetime.strptime(line[:23], '%Y-%m-%d %H:%M:%S.%f').timestamp()


def read_logs(directory):
    """({instance: node}, [(time, instance, action)] of the services' "done" lines,
    {node: [(time, kind, seconds)]} of Ironic's API requests and ends)."""
    node_of, done = {}, []
    for path in glob.glob(os.path.join(directory, 'compute-*.log')):
        with open(path) as log:
            for line in log:
                if match := ACTIVE.search(line):
                    node_of[match.group(1)] = match.group(2)
                elif match := DONE.search(line):
                    done.append((_time(line), match.group(1), match.group(2)))
    events = {}
    with open(os.path.join(directory, 'ironic', 'log', 'ironic.log')) as log:
        for line in log:
            if ' ironic.api ' in line and (match := NODE_REQUEST.search(line)):
                kind = match.group(1) + (match.group(3).split('?')[0] or '')
                events.setdefault(match.group(2), []).append(
                    (_time(line), kind, float(match.group(4)) / 1000))
            elif match := ENDED.search(line):
                events.setdefault(match.group(1), []).append((_time(line), 'ENDED', 0.0))
    return node_of, done, events


def traces(directory, action):
    """One dict per ``action`` logged done on a node whose read, call and end
    were found within 6 s before it."""
    node_of, done, events = read_logs(directory)
    found = []
    for done_at, instance, name in sorted(done):
        if name != action or instance not in node_of:
            continue
        near = [e for e in events.get(node_of[instance], ()) if done_at - 6 < e[0] <= done_at]
        calls = [e for e in near if e[1].startswith('PUT')]
        if not calls:
            continue
        call_end, _kind, call_took = calls[-1]
        call_start = call_end - call_took
        reads = [e for e in near if e[1] == 'GET' and e[0] <= call_start]
        ended = [e for e in near if e[1] == 'ENDED' and e[0] >= call_start]
        if not reads or not ended:
            continue
        read_end, _kind, read_took = reads[-1]
        found.append({'read_start': read_end - read_took, 'read_end': read_end,
                      'read_took': read_took, 'call_start': call_start,
                      'call_end': call_end, 'call_took': call_took,
                      'ended': ended[-1][0], 'done': done_at})
    return found


def bursts(found):
    """The reads' start times, grouped by burst, each from its first."""
    starts = sorted(trace['read_start'] for trace in found)
    groups = []
    for start in starts:
        if groups and start - groups[-1][-1] <= BURST_GAP:
            groups[-1].append(start)
        else:
            groups.append([start])
    return [[round(s - group[0], 2) for s in group] for group in groups]


def main(argv=None):
    parser = argparse.ArgumentParser(prog='tools/trace_actions.py',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('directory', help="a bench_instances.py run's state directory")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.directory, 'ironic', 'log', 'ironic.log')):
        parser.error(f'{args.directory}: no ironic/log/ironic.log there')
    found = {action: traces(args.directory, action) for action in ACTIONS}
    print(f'Seconds, median of each part ({args.directory}):')
    print(f'  {"part":<14}' + ''.join(f'{a:>14}' for a in ACTIONS))
    print(f'  {"actions":<14}' + ''.join(f'{len(found[a]):>14}' for a in ACTIONS))
    for label, part in PARTS:
        cells = [f'{statistics.median(part(t) for t in found[a]):.3f}' if found[a] else '-'
                 for a in ACTIONS]
        print(f'  {label:<14}' + ''.join(f'{c:>14}' for c in cells))
    print('When the reads of each burst began, from its first (s):')
    for action in ACTIONS:
        for group in bursts(found[action]):
            if len(group) > 1:
                print(f'  {action}: {len(group)} reads over {group[-1]:.2f} s, '
                      f'median {statistics.median(group):.2f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
