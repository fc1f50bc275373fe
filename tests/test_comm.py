"""The pure parts of ``taskgraph.comm``: how a poller backs off."""

from __future__ import annotations

import pytest

from taskgraph.comm import FIRST_SLEEP, LONG_SLEEP, next_sleep

CAP = 250e-6


def sleeps(waited_per_step: float, steps: int, cap: float = CAP) -> list[float]:
    """The sleeps of a poller that finds nothing ``steps`` times, waiting as it sleeps
    plus ``waited_per_step`` of work each time."""
    out, sleep, waited = [], 0.0, 0.0
    for _ in range(steps):
        sleep = next_sleep(sleep, waited, cap)
        waited += sleep + waited_per_step
        out.append(sleep)
    return out


def test_a_short_wait_doubles_from_the_first_sleep_up_to_the_cap():
    s = sleeps(0.0, 6)
    assert s[0] == FIRST_SLEEP
    assert s[1] == 2 * FIRST_SLEEP and s[2] == 4 * FIRST_SLEEP
    assert max(s) == CAP  # 20, 40, 80, 160, 250, 250 µs


def test_a_long_wait_sleeps_longer_but_never_more_than_a_twentieth_of_it():
    s = sleeps(0.0, 400)
    waited = 0.0
    for sleep in s:
        assert sleep <= max(CAP, 0.05 * waited) + 1e-12
        waited += sleep
    assert s[-1] == LONG_SLEEP
    # two seconds of waiting cost a few hundred wake-ups, not the 8,000 of a 250 µs cap
    n, waited = 0, 0.0
    while waited < 2.0:
        waited += s[min(n, len(s) - 1)]
        n += 1
    assert n < 600


@pytest.mark.parametrize("cap", [1e-5, CAP, 1e-3, 2e-2])
def test_the_cap_holds_while_the_wait_is_short(cap):
    assert next_sleep(1.0, 0.0, cap) == cap
    assert next_sleep(0.0, 0.0, cap) == min(cap, FIRST_SLEEP)
