"""A hostile production user's second review of the control plane and keyed families: a retuned
family builds its later keys exactly as it retuned the keys it held."""

from __future__ import annotations

import pytest

from stoic import BlockingRateLimiter, ControlPlane, Keyed, RateLimiter
from stoic.testing import VirtualClock


@pytest.mark.parametrize("factory", [RateLimiter, BlockingRateLimiter])
@pytest.mark.parametrize("burst", [{}, {"burst": 5}])
def test_a_limiter_familys_later_keys_get_the_burst_its_held_keys_were_retuned_to(
        factory: type, burst: dict[str, int], clock: VirtualClock) -> None:
    # A burst equal to the rate (or none given) follows the rate across a retune: every key's,
    # those held then and those built later alike (one family, one configuration).
    family = Keyed(factory, label="tenants", rate=5, clock=clock, **burst)
    plane = ControlPlane(clock=clock)
    plane.register(family)
    held = family.get("held")
    plane.retune("tenants", rate=10)
    later = family.get("later")
    assert (held.rate, held.burst) == (later.rate, later.burst) == (10, 10)
    # An explicit burst of its own stays as it is, on every key.
    plane.retune("tenants", burst=3)
    plane.retune("tenants", rate=20)
    newest = family.get("newest")
    assert [(p.rate, p.burst) for p in (held, later, newest)] == [(20, 3)] * 3
