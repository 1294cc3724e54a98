"""Test hooks injected into the product from outside (it has none itself)."""

import os
import time


def hang_while(path, run_cycle):
    """``run_cycle`` (ResourceTracker.run_cycle) that first waits while the
    file ``path`` exists: a cycle stuck inside the watchdog's turn."""
    def hanging_run_cycle(self, *args, **kwargs):
        while os.path.exists(path):
            time.sleep(0.1)
        return run_cycle(self, *args, **kwargs)
    return hanging_run_cycle
