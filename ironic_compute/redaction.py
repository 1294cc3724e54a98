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

"""Credentials out of text that comes from elsewhere.

Ironic's ``last_error`` (of a node or an allocation) quotes what failed,
and that can be an image or a BMC URL with a user and a password in it.
The text goes into an instance's fault (shown by ``instance show``) and
into the log, so the credentials are cut before it is kept anywhere.
"""

import contextlib
import json
import re

from ironic_compute import exception

# scheme://userinfo@ : the userinfo runs to the last "@" of the URL (a
# password may hold an unescaped "@" or "/"), which ends at a space, a
# quote or an angle bracket. A URL without credentials but with an "@" in
# its path loses a little more than its userinfo: safe, and rare.
_URL_CREDENTIALS = re.compile(
    r"""(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s'"<>@]*(?:@[^\s'"<>@]*)*@""")
_HIDDEN = '***'


def url_credentials(text):
    """``text`` with ``scheme://user:password@host`` as ``scheme://***@host``.

    None stays None.
    """
    if text is None:
        return None
    return _URL_CREDENTIALS.sub(rf'\g<scheme>{_HIDDEN}@', str(text))


@contextlib.contextmanager
def secret_kept_out(secret):
    """Inside: an IronicComputeError raised whose text quotes ``secret`` (a
    password, user data; as it is, as a JSON string holds it, or as
    Python's repr of a str or a dict holds it) is raised again, of the same
    type, with ``***`` in its place and without its cause, which a
    traceback would print. Nothing is done for an empty ``secret``."""
    try:
        yield
    except exception.IronicComputeError as exc:
        text = str(exc)
        # The longest form first: a form inside another one would leave
        # the rest of the longer one behind.
        forms = sorted((form for form in _quoted_forms(secret) if form in text),
                       key=len, reverse=True)
        if not forms:
            raise
        for form in forms:
            text = text.replace(form, _HIDDEN)
        raise type(exc)(text) from None


def _quoted_forms(secret):
    """The ways a message may quote ``secret``: itself, inside a JSON
    string, inside Python's repr (of the str, or of a dict holding it),
    each also with its whitespace collapsed as text.one_line() writes every
    message (user data is indented, a password may hold two spaces); none
    for an empty secret, nor an empty form."""
    if not secret:
        return set()
    forms = {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1]}
    forms |= {' '.join(form.split()) for form in forms}
    return {form for form in forms if form}
