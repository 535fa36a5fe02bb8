"""The agent's periodic upkeep threads (drift check, flow repair, namespace sources): one
daemon thread per job that runs it every `period` seconds until the agent stops."""
from __future__ import annotations

import threading
from collections.abc import Callable


def every(period: float, stop: threading.Event, job: Callable[[], object],
          name: str) -> threading.Thread:
    """Starts `name`: job() each period, the first one period from now, until stop is set
    (a stop during a wait ends it at once; a job running finishes first)."""
    def loop() -> None:
        while not stop.wait(period):
            job()

    t = threading.Thread(target=loop, name=name, daemon=True)
    t.start()
    return t
