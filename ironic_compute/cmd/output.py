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

"""How ironic-compute-manage prints what it found: a table or JSON.

A listing is a list of dicts and a list of :class:`Column`; a single object
(``node show``) is one dict shown as a Field/Value table. The JSON carries
the same keys as the dicts, with times as ISO 8601 UTC strings, so a script
never has to parse a table.
"""

import dataclasses
import datetime
import json
import sys
from collections.abc import Callable

FORMATS = ('table', 'json')


@dataclasses.dataclass(frozen=True)
class Column:
    key: str
    header: str
    # Turns the value into the text of a table cell; JSON is not affected.
    text: Callable | None = None


def columns(*specs):
    """Columns from ``(key, header[, text])`` tuples."""
    return [Column(*spec) for spec in specs]


def optional(template):
    """A Column.text that formats a value with ``template``, None as '-'."""
    return lambda value: '-' if value is None else template.format(value)


def cell(value):
    """The table text of a plain value."""
    if value is None:
        return '-'
    if isinstance(value, bool):
        return 'yes' if value else 'no'
    if isinstance(value, float):
        return f'{value:.3f}'
    if isinstance(value, datetime.datetime):
        return value.strftime('%Y-%m-%d %H:%M:%S')
    if isinstance(value, (list, tuple, set, frozenset)):
        return ', '.join(str(v) for v in value) or '-'
    return str(value)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table(headers, rows, right=()):
    """A bordered text table; ``right`` holds the indexes to right-align."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    rule = '+' + '+'.join('-' * (w + 2) for w in widths) + '+'

    def line(texts):
        cells = [t.rjust(w) if i in right else t.ljust(w)
                 for i, (t, w) in enumerate(zip(texts, widths, strict=True))]
        return '| ' + ' | '.join(cells) + ' |'

    out = [rule, line(headers), rule]
    out += [line(row) for row in rows]
    if rows:
        out.append(rule)
    return '\n'.join(out)


def listing_table(records, columns):
    """``records`` (dicts) as a table of ``columns``; numbers right-aligned."""
    rows = [[(c.text or cell)(r.get(c.key)) for c in columns] for r in records]
    right = {i for i, c in enumerate(columns)
             if any(_is_number(r.get(c.key)) for r in records)
             and all(_is_number(r.get(c.key)) or r.get(c.key) is None
                     for r in records)}
    return table([c.header for c in columns], rows, right)


def record_table(record, columns):
    """One dict as a Field/Value table, in the order of ``columns``."""
    rows = [[c.header, (c.text or cell)(record.get(c.key))] for c in columns]
    return table(['Field', 'Value'], rows)


def _json_default(value):
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return value.isoformat() + 'Z'
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f'cannot render {type(value).__name__} as JSON')


def to_json(data):
    return json.dumps(data, indent=2, sort_keys=False, default=_json_default)


def emit(text, stream=None):
    print(text, file=stream or sys.stdout)


def show_listing(records, columns, fmt):
    emit(to_json(records) if fmt == 'json' else listing_table(records, columns))


def show_record(record, columns, fmt):
    emit(to_json(record) if fmt == 'json' else record_table(record, columns))


def show_report(report, fmt, summary, *listings):
    """``report`` as JSON, or its ``summary`` table followed by each
    ``(records, columns)`` listing; a listing whose records are None is left
    out (an empty list still prints its headers)."""
    if fmt == 'json':
        emit(to_json(report))
        return
    emit(record_table(report, summary))
    for records, columns in listings:
        if records is not None:
            emit('')
            emit(listing_table(records, columns))
