"""The off-policy schedule contract of docs/paper.md#lag-rule, checked against hand-derived tables."""

import pytest

from oprl.schedule import lag, policy_version


def reference(step, k, m):
    """The schedule from its story: the explorer runs m steps ahead and refreshes weights every k steps.

    It generates batch t once the trainer has finished step t-1-m, holding the newest weights published at
    a sync point (trainer steps k, 2k, ...) by then, or the initial weights if none was published yet.
    """
    finished = max(step - 1 - m, 0)
    published = list(range(k, finished + 1, k))
    return published[-1] if published else 0


CASES = [(1, 0), (1, 1), (1, 10), (4, 0), (20, 0), (3, 2), (300, 199)]


@pytest.mark.parametrize("k, m", CASES)
def test_policy_version_matches_simulation(k, m):
    for t in range(1, 400):
        assert policy_version(t, k, m) == reference(t, k, m), (k, m, t)


def test_hand_tables():
    assert [policy_version(t, 1, 0) for t in range(1, 6)] == [0, 1, 2, 3, 4]
    assert [policy_version(t, 1, 1) for t in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [policy_version(t, 1, 10) for t in (1, 11, 12, 13)] == [0, 0, 1, 2]
    assert [policy_version(t, 4, 0) for t in range(1, 11)] == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]
    assert [policy_version(t, 3, 2) for t in range(1, 11)] == [0, 0, 0, 0, 0, 3, 3, 3, 6, 6]
    assert {policy_version(t, 300, 199) for t in range(1, 161)} == {0}  # the paper's offline setting
    assert [lag(t, 1, 10) for t in (1, 11, 12, 50)] == [0, 10, 10, 10]
    assert max(lag(t, 20, 0) for t in range(1, 161)) == 19


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        policy_version(0, 1, 0)
