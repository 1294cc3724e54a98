"""Functional fixtures: the session's real Ironic (see ironic_env.py)."""

from tests.functional.ironic_env import ironic_client  # noqa: F401
from tests.functional.ironic_env import ironic_nodes  # noqa: F401
from tests.functional.ironic_env import ironic_server  # noqa: F401
