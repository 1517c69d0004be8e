"""Wall-clock of a load's phases, for `river generate --json` and the report of a call."""

from __future__ import annotations

import time


class Phases:
    """Seconds per named phase, each from the end of the one before (or the start)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now
