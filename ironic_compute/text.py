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

"""Messages on one line: what every log line, fault and CLI error is made of."""


def one_line(message, limit=None):
    """``message`` (text or an exception) with its whitespace collapsed, at
    most ``limit`` characters (an exception without text: its class name)."""
    text = ' '.join(str(message).split())
    if not text and isinstance(message, BaseException):
        text = type(message).__name__
    if limit is not None and len(text) > limit:
        text = text[:limit - 3] + '...'
    return text
