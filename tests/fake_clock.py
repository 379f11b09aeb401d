"""A clock for the waits' unit tests: `clock()` reads the time, `clock.sleep(s)` records the sleep and moves the time on,
so a wait's polls and timeout are tested without waiting."""
from __future__ import annotations


class FakeClock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds
