"""stoic's pytest plugin (stoic.testing._plugin, the ``stoic`` pytest11 entry point): per-call-site
retry budgets do not carry one test's clock or tokens into the next (issue 9)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USER_SUITE = '''
import stoic
from stoic import RetryBudget, Schedule

SCHEDULE = Schedule.fixed(0).attempts(50)

def spend_at_one_site():
    calls = []
    def op():
        calls.append(1)
        raise ConnectionError
    try:
        stoic.retry_sync(SCHEDULE, op, label="shared")
    except ConnectionError:
        pass
    return len(calls)

def site_budget():
    import stoic._budget as b
    return [v for k, v in b._registry._budgets.items() if k.startswith("site:")]

def test_first_spends_the_reserve_on_a_virtual_clock():
    from stoic.testing import VirtualClock
    virtual = VirtualClock()
    with stoic.use_clock(virtual):
        assert spend_at_one_site() == 11  # 1 attempt + the 10 reserve tokens, then budget_exhausted
    (budget,) = site_budget()
    assert budget._clock is virtual

def test_second_starts_with_a_full_budget_on_its_own_clock():
    assert spend_at_one_site() == 11  # not 1: the previous test's spent tokens are gone
    (budget,) = site_budget()
    assert budget._clock is stoic.current_clock()

def test_fixtures(virtual_clock, recording_sink):
    assert stoic.current_clock() is virtual_clock
    spend_at_one_site()
    assert recording_sink.names[-1] == "retry.budget_exhausted"
'''


def test_budgets_are_fresh_in_every_test_of_a_users_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_without_the_plugin_the_second_test_inherits_the_spent_budget(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_SUITE)
    result = pytester.runpytest_subprocess("-p", "no:stoic", "-p", "no:randomly", "-p", "no:cacheprovider")
    # The second test makes one attempt: the first test's virtual-clock budget is spent and
    # never refills (its clock stands still). The fixtures are gone too.
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and outcomes.get("failed") == 1 and outcomes.get("errors") == 1
    result.stdout.fnmatch_lines(["*assert 1 == 11*"])
