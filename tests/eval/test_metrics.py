import pytest

from temper.eval.metrics import ks_for, pass_at_k


def test_pass_at_k_hand_computed():
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_ks():
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]


def test_wilson_interval_hand_computed():
    from temper.eval.metrics import wilson_interval

    lo, hi = wilson_interval(8, 10)
    # p=0.8, n=10, z=1.96: center 0.7167, half-width 0.2258 (hand-computed)
    assert abs(lo - 0.4902) < 1e-3 and abs(hi - 0.9433) < 1e-3
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_majority_vote_ignores_missing_and_breaks_ties_by_order():
    from temper.eval.metrics import majority_vote

    assert majority_vote(["3", None, "4", "3"]) == "3"
    assert majority_vote(["4", "3"]) == "4"
    assert majority_vote([None, None]) is None
