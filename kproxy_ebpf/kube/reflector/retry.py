"""When a reflector tries again, as client-go does: errors back off exponentially with jitter;
an expired resourceVersion relists at once, unless it keeps expiring with no working watch in
between (a server that expires what it just listed), when it backs off like an error."""
from __future__ import annotations

import random


class Retry:
    """The backoff of one reflector's loop; `delay` is the base of the next wait."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.delay = initial
        self.expired_in_a_row = 0

    def worked(self) -> None:
        """A watch ran (it delivered something, or lasted): the next failure starts over."""
        self.delay = self.initial
        self.expired_in_a_row = 0

    def expired(self, streamed: bool) -> float:
        """The wait before relisting after a 410; `streamed`: this round's watch delivered."""
        if streamed:
            self.delay, self.expired_in_a_row = self.initial, 0
        self.expired_in_a_row += 1
        return self._next() if self.expired_in_a_row > 1 else 0.0

    def failed(self, listed: bool, streamed: bool) -> float:
        """The wait after any other failure; `listed`/`streamed`: this round got that far."""
        if listed or streamed:
            self.delay = self.initial      # it worked for a while: start over
        if streamed:
            # A working watch broke: a 410 when it resumes is a first expiry again.
            self.expired_in_a_row = 0
        return self._next()

    def _next(self) -> float:
        wait = min(self.maximum, self.delay * random.uniform(0.8, 1.2))
        self.delay = min(self.delay * 2, self.maximum)
        return wait
