"""Properties of minigrpo/exact/frontier.py: the exact KL-regularised optimum π*_β ∝ π_ref·e^{r/β},
its figures, the reward–KL frontier it traces, the inverses (frontier reward at a KL, implied β),
score(), and pass@k. Small outcome spaces, float64 throughout; every failure names the property and
the example."""

import math

import pytest
import torch
from conftest import SET, T
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.exact.frontier import (
    frontier,
    frontier_reward_at,
    implied_beta,
    kl,
    optimum,
    optimum_figures,
    pass_at_k,
    pass_at_k_estimate,
    score,
    score_many,
)

INF = math.inf


def distribution(weights):
    w = T(weights)
    return w / w.sum()


def case(reward=st.floats(-3, 3), zeros=True):
    """(p_ref, r) on 2-8 outcomes; p_ref may hold exact zeros (never all)."""
    weight = st.one_of(st.just(0.0), st.floats(1e-3, 1.0)) if zeros else st.floats(1e-3, 1.0)
    return st.integers(2, 8).flatmap(
        lambda k: st.tuples(
            st.lists(weight, min_size=k, max_size=k).filter(lambda w: sum(w) > 0).map(distribution),
            st.lists(reward, min_size=k, max_size=k).map(T),
        )
    )


integer_rewards = st.integers(-2, 2).map(float)  # ties and gaps of at least 1
betas = st.sampled_from([0.0, 1e-4, 1e-2, 0.3, 1.0, 7.0, 1e3, INF])


def best(p, r):
    """1 on the argmax of r over p's support, else 0."""
    return (p > 0) & (r == r[p > 0].max())


def is_sorted(x, tol=1e-12):
    return bool((x[1:] >= x[:-1] - tol).all())


@SET
@given(case(), betas)
def test_optimum_is_a_distribution_and_keeps_outcomes_of_reference_probability_zero_at_zero(
    c, beta
):
    p, r = c
    pi = optimum(p, r, beta)
    assert pi.shape == p.shape and pi.dtype == torch.float64, (
        f"optimum must return (K,) float64, got {pi}"
    )
    assert torch.isfinite(pi).all() and (pi >= 0).all(), (
        f"π* at β={beta} has bad entries {pi.tolist()}"
    )
    assert abs(pi.sum().item() - 1) < 1e-12, (
        f"π* at β={beta} sums to {pi.sum().item()}, not 1 (divide by Z_β)"
    )
    assert (pi[p == 0] == 0).all(), (
        f"π* at β={beta} gives mass {pi.tolist()} where p_ref {p.tolist()} is 0"
    )


@SET
@given(case(integer_rewards))
def test_optimum_tends_to_reference_as_beta_grows_and_to_the_best_outcomes_as_beta_shrinks(c):
    p, r = c
    assert torch.allclose(optimum(p, r, INF), p, atol=1e-15), (
        "β = ∞ must give π_ref exactly (r/β = 0)"
    )
    assert torch.allclose(optimum(p, r, 1e6), p, atol=1e-5), (
        f"β = 1e6 must be close to π_ref {p.tolist()}"
    )
    limit = p * best(p, r)
    limit = limit / limit.sum()
    for beta in (0.0, 1e-4, 1e-3):
        got = optimum(p, r, beta)
        assert torch.allclose(got, limit, atol=1e-12), (
            f"β={beta}: π* {got.tolist()} must be π_ref restricted to argmax r, renormalised: "
            f"{limit.tolist()}"
        )


@SET
@given(case())
def test_frontier_kl_and_reward_rise_as_beta_falls_kl_is_non_negative(c):
    p, r = c
    f = frontier(p, r)
    assert is_sorted(-f["beta"]), (
        f"frontier points must come in order of decreasing β: {f['beta'].tolist()}"
    )
    assert (f["kl"] >= 0).all(), f"KL* must be ≥ 0: {f['kl'].tolist()}"
    assert is_sorted(f["kl"]), f"KL(π*_β‖π_ref) must be non-increasing in β: {f['kl'].tolist()}"
    assert is_sorted(f["expected_reward"]), (
        f"E*[r] must be non-increasing in β: {f['expected_reward'].tolist()}"
    )


@SET
@given(case())
def test_frontier_ends_are_the_reference_and_the_beta_to_zero_limit(c):
    p, r = c
    f = frontier(p, r)
    assert f["beta"][0] == INF and f["beta"][-1] == 0, (
        f"the points must start at β=∞, end at 0: {f['beta']}"
    )
    assert f["kl"][0] < 1e-15 and abs(f["expected_reward"][0] - (p * r).sum()) < 1e-12, (
        "β=∞ is (0, E_ref[r])"
    )
    want_kl = -math.log(p[best(p, r)].sum().item())
    assert abs(f["kl"][-1].item() - want_kl) < 1e-12, (
        f"β→0: KL must be −log P_ref(argmax) = {want_kl}"
    )
    assert f["expected_reward"][-1] == r[p > 0].max(), (
        "β→0: E[r] must be max r over p_ref's support"
    )


@SET
@given(case())
def test_frontier_is_concave_its_chord_slopes_lie_between_the_betas_at_their_ends(c):
    p, r = c
    f = frontier(p, r)
    b, k, e = f["beta"].tolist(), f["kl"].tolist(), f["expected_reward"].tolist()
    slopes = []
    for i in range(len(k) - 1):
        if k[i + 1] - k[i] > 1e-7:  # slope df/dK = β: every chord's slope lies in [β_(i+1), β_i]
            slope = (e[i + 1] - e[i]) / (k[i + 1] - k[i])
            assert b[i + 1] * (1 - 1e-6) - 1e-9 <= slope <= b[i] * (1 + 1e-6) + 1e-9, (
                f"chord slope {slope} between β={b[i]} and β={b[i + 1]} must lie between them "
                "(df/dK = β)"
            )
            slopes.append(slope)
    assert all(s2 <= s1 * (1 + 1e-6) + 1e-9 for s1, s2 in zip(slopes, slopes[1:])), (
        f"chord slopes must not rise (concave frontier): {slopes}"
    )


@SET
@given(case(), st.lists(st.floats(0, 1), min_size=8, max_size=8), st.floats(0.05, 5))
def test_no_distribution_beats_the_frontier_and_the_optimum_wins_by_beta_times_kl_to_it(
    c, weights, beta
):
    p, r = c
    q = T(weights[: len(p)]) * (p > 0)  # on p_ref's support: KL(q‖π_ref) is finite
    if q.sum() <= 0:
        q = p.clone()
    q = q / q.sum()
    k, reward = kl(q, p), (q * r).sum().item()
    top = frontier_reward_at(p, r, k)
    assert reward <= top + 1e-9, (
        f"q={q.tolist()} has E[r] {reward} above the frontier {top} at its KL {k}"
    )
    star = optimum_figures(p, r, beta)
    gap = (star["expected_reward"] - beta * star["kl"]) - (reward - beta * k)
    want = beta * kl(q, optimum(p, r, beta))
    assert abs(gap - want) < 1e-9, f"J_β(π*) − J_β(q) = {gap} must equal β·KL(q‖π*) = {want} (≥ 0)"


@SET
@given(case(), st.floats(0.2, 10))
def test_closed_forms_agree_with_a_direct_float64_computation(c, beta):
    p, r = c
    w = p * torch.exp(r / beta)
    z = w.sum()
    pi = w / z
    on = pi > 0
    want = {
        "expected_reward": (pi * r).sum().item(),
        "kl": (pi[on] * (pi[on] / p[on]).log()).sum().item(),
        "log_z": z.log().item(),
    }
    assert torch.allclose(optimum(p, r, beta), pi, atol=1e-6), "π* must be π_ref·e^{r/β}/Z_β"
    got = optimum_figures(p, r, beta)
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-6, f"{key} at β={beta}: {got[key]} vs direct {value}"
    assert abs(got["kl"] - (got["expected_reward"] / beta - got["log_z"])) < 1e-6, (
        "KL* = E*[r]/β − log Z_β"
    )


@SET
@given(case(st.sampled_from([0.0, 1.0])), betas)
def test_a_zero_one_reward_keeps_every_outcome_in_reference_proportions_within_its_reward(c, beta):
    p, r = c
    pi = optimum(p, r, beta)
    for value in (0.0, 1.0):
        group = (r == value) & (p > 0)
        if pi[group].sum() > 0:
            got, want = pi[group] / pi[group].sum(), p[group] / p[group].sum()
            assert torch.allclose(got, want, atol=1e-12), (
                f"β={beta}: outcomes of reward {value} keep π_ref's proportions {want.tolist()}, "
                f"got {got.tolist()}"
            )


@SET
@given(case(integer_rewards, zeros=False), st.floats(0.1, 5))
def test_implied_beta_inverts_the_optimums_expected_reward(c, beta):
    p, r = c
    e = optimum_figures(p, r, beta)["expected_reward"]
    e_ref, top = (p * r).sum().item(), r.max().item()
    assert implied_beta(p, r, e_ref) == INF and implied_beta(p, r, e_ref - 1) == INF, (
        "E ≤ E_ref[r] -> inf"
    )
    if top > e_ref + 1e-9:  # (a constant reward: E_ref = max r, and inf wins)
        assert implied_beta(p, r, top) == 0 and implied_beta(p, r, top + 1) == 0, "E ≥ max r -> 0"
    if e_ref + 1e-9 < e < top - 1e-9:
        got = implied_beta(p, r, e)
        back = optimum_figures(p, r, got)["expected_reward"]
        assert abs(back - e) < 1e-12 * (1 + abs(e)), (
            f"E*[r] at the implied β {got} is {back}, not {e}"
        )
        assert abs(got - beta) < 1e-5 * beta, f"implied_beta(E*[r] at β={beta}) gave {got}"


@SET
@given(case(integer_rewards, zeros=False), st.floats(0.1, 5))
def test_the_optimum_scores_zero_regret_its_own_beta_and_zero_kl_to_itself(c, beta):
    p, r = c
    pi = optimum(p, r, beta)
    s = score(pi, p, r, beta=beta)
    assert s["regret"] < 1e-9, f"π*_β lies ON the frontier: regret must be 0, got {s['regret']}"
    assert s["kl_to_optimum"] < 1e-12, f"KL(π*_β‖π*_β) must be 0, got {s['kl_to_optimum']}"
    assert abs(s["kl_ref"] - optimum_figures(p, r, beta)["kl"]) < 1e-12, (
        "kl_ref must be KL(π_θ‖π_ref)"
    )
    # E*[r] strictly between E_ref and max r: β is identifiable
    if s["implied_beta"] not in (0.0, INF):
        assert abs(s["implied_beta"] - beta) < 1e-5 * beta, (
            f"implied β {s['implied_beta']} must be {beta}"
        )
        assert s["kl_to_implied_optimum"] < 1e-9, (
            f"KL to the implied optimum: {s['kl_to_implied_optimum']}"
        )


@SET
@given(case(), st.lists(st.floats(0, 1), min_size=8, max_size=8))
def test_score_of_any_policy_has_non_negative_regret_and_of_the_reference_zero(c, weights):
    p, r = c
    q = T(weights[: len(p)]) * (p > 0)
    q = q / q.sum() if q.sum() > 0 else p
    s = score(q, p, r)
    assert s["regret"] >= 0 and s["kl_to_implied_optimum"] >= 0 and "kl_to_optimum" not in s, f"{s}"
    ref = score(p, p, r)
    assert ref["kl_ref"] == 0 and ref["regret"] < 1e-12 and ref["implied_beta"] == INF, (
        f"score(π_ref): {ref}"
    )


@SET
@given(
    case(),
    st.lists(st.lists(st.floats(0, 1), min_size=8, max_size=8), min_size=2, max_size=20),
    st.sampled_from([None, 0.3]),
)
def test_score_many_is_the_score_of_each_policy(c, rows, beta):
    """score_many's root findings of all rows together find what each row's own finds: each row's
    steps are its own, so the figures are the same numbers."""
    p, r = c
    qs = []
    for weights in rows:
        q = T(weights[: len(p)]) * (p > 0)
        qs.append(q / q.sum() if q.sum() > 0 else p)
    many = score_many(torch.stack(qs), p, r, beta)
    for q, got in zip(qs, many):
        want = score(q, p, r, beta)
        assert got == want


@SET
@given(case(integer_rewards, zeros=False), st.lists(st.floats(0.05, 20), min_size=1, max_size=40))
def test_the_optimums_of_many_betas_score_as_optimums_all_at_once(c, betas):
    """π*_β of many β, scored as one population: each lies on the frontier (regret 0), its implied β
    is its own β and it is its implied optimum. Each row's root is found beside the others'
    (frontier._root_rows)."""
    p, r = c
    e_ref, top = (p * r).sum().item(), r.max().item()
    many = score_many(torch.stack([optimum(p, r, b) for b in betas]), p, r)
    for beta, s in zip(betas, many):
        assert s["regret"] < 1e-12 * (1 + top - r.min().item()), (beta, s)
        if e_ref + 1e-9 < s["expected_reward"] < top - 1e-9:  # β identifiable from E*[r]
            assert (
                abs(s["implied_beta"] - beta) < 1e-6 * beta and s["kl_to_implied_optimum"] < 1e-12
            ), (beta, s)


def test_score_refuses_a_policy_with_mass_where_the_reference_has_none():
    p, r = T([0.5, 0.5, 0.0]), T([0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="above the exact frontier"):
        # E = 1 at infinite KL, where π_ref's optimum reaches only 0
        score(T([0.0, 0.0, 1.0]), p, r)


def test_score_many_refuses_a_row_that_is_not_a_distribution_naming_its_sum():
    p, r = T([0.5, 0.5]), T([0.0, 1.0])
    with pytest.raises(
        ValueError, match="p_theta must be a probability distribution .* got sum 0.9"
    ):
        score_many(T([[0.5, 0.5], [0.4, 0.5], [0.2, 0.9]]), p, r)
    with pytest.raises(ValueError, match="p_theta must be a probability distribution"):
        score_many(T([[0.5, 0.5], [1.5, -0.5]]), p, r)  # sums to 1, but a negative probability
    shape = (
        r"p_theta must be of shape \(K,\) or rows \(M, K\) and r \(K,\), got \(2, 3\) and \(2,\)"
    )
    with pytest.raises(ValueError, match=shape):
        score_many(T([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]), p, r)


def test_one_reference_is_refused_as_rows_or_beside_rewards_of_another_length():
    r = T([0.0, 1.0])
    with pytest.raises(
        ValueError, match=r"p_ref must be of shape \(K,\) and r \(K,\), got \(1, 2\) and \(2,\)"
    ):
        optimum(T([[0.5, 0.5]]), r, 0.1)
    with pytest.raises(
        ValueError, match=r"p_ref must be of shape \(K,\) and r \(K,\), got \(3,\) and \(2,\)"
    ):
        score(T([0.5, 0.5, 0.0]), T([0.5, 0.5, 0.0]), r)
    with pytest.raises(ValueError, match=r"got \(2,\) and \(1, 2\)"):
        frontier(T([0.5, 0.5]), T([[0.0, 1.0]]))


def test_extreme_betas_and_rewards_stay_finite():
    p, r = T([0.2, 0.3, 0.5, 0.0]), T([1e3, -1e3, 999.0, 5e3])
    for beta in (1e-4, 1e-2, 1e4):
        pi, fig = optimum(p, r, beta), optimum_figures(p, r, beta)
        assert torch.isfinite(pi).all() and abs(pi.sum() - 1) < 1e-12, (
            f"β={beta}: π* = {pi.tolist()}"
        )
        assert all(math.isfinite(v) for v in fig.values()), (
            f"β={beta}: figures {fig} (use logsumexp)"
        )
        assert fig["kl"] <= -math.log(0.2) + 1e-12, (
            f"β={beta}: KL* {fig['kl']} beyond the β→0 limit"
        )
    assert optimum_figures(p, r, 0.0)["log_z"] == INF, "log Z_β → +∞ as β → 0 when max r > 0"


def test_a_constant_reward_leaves_the_reference_unchanged():
    p, r = T([0.2, 0.3, 0.5]), T([2.0, 2.0, 2.0])
    for beta in (0.0, 1e-3, 1.0, INF):
        assert torch.allclose(optimum(p, r, beta), p, atol=1e-15), (
            f"β={beta}: nothing to gain, π* = π_ref"
        )
    f = frontier(p, r)
    assert (f["kl"] == 0).all() and (f["expected_reward"] == 2).all(), (
        "the frontier of a constant is one point"
    )
    assert implied_beta(p, r, 2.0) == INF and frontier_reward_at(p, r, 1.0) == 2.0


@SET
@given(case(zeros=False), st.sampled_from([1e-6, 0.01, 0.3, 1.0, 3.0]))
def test_frontier_reward_at_a_points_kl_is_that_points_reward(c, target):
    p, r = c
    f = frontier(p, r)
    limit = f["kl"][-1].item()
    assert frontier_reward_at(p, r, 0.0) == pytest.approx((p * r).sum().item(), abs=1e-12), (
        "f(0) = E_ref[r]"
    )
    assert frontier_reward_at(p, r, limit + 1) == r.max().item(), "beyond the β→0 limit's KL: max r"
    i = int((f["kl"] - target * limit).abs().argmin())
    k, e = f["kl"][i].item(), f["expected_reward"][i].item()
    got = frontier_reward_at(p, r, k)
    assert abs(got - e) < 1e-7 * (1 + abs(e)), (
        f"f({k}) = {got}, but the frontier point at β={f['beta'][i]} has {e}"
    )


def test_kl_follows_the_conventions_of_outcome_distributions():
    p, q = T([0.5, 0.5, 0.0]), T([0.25, 0.75, 0.0])
    want = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert kl(p, q) == pytest.approx(want, abs=1e-15), "KL(p‖q) = Σ p log(p/q), with 0·log 0 = 0"
    assert kl(q, T([0.5, 0.0, 0.5])) == INF, "KL is inf where p > 0 = q"
    assert kl(p, p) == 0


def test_inputs_that_are_not_distributions_are_refused():
    with pytest.raises(ValueError, match="distribution"):
        optimum(T([0.5, 0.6]), T([0.0, 1.0]), 1.0)
    with pytest.raises(ValueError, match="shape"):
        optimum(T([0.5, 0.5]), T([0.0, 1.0, 2.0]), 1.0)


@SET
@given(st.floats(0, 1), st.integers(1, 50))
def test_pass_at_k_is_one_minus_the_chance_that_k_tries_all_fail(p, k):
    want = 1 - (1 - p) ** k
    assert pass_at_k(p, k) == pytest.approx(want, abs=1e-12), (
        f"pass@{k} at p={p}: 1 − (1 − p)^k = {want}"
    )
    assert pass_at_k(T([p]), k).item() == pytest.approx(want, abs=1e-12), (
        "the tensor form must agree"
    )
    assert pass_at_k(p, k + 1) >= pass_at_k(p, k), "more tries never pass less often"
    assert pass_at_k(p, 1) == pytest.approx(p, abs=1e-15) and pass_at_k(1e-12, 3) == pytest.approx(
        3e-12
    )


@SET
@given(
    st.integers(1, 16).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))), st.floats(0, 1)
)
def test_the_pass_at_k_estimator_is_unbiased_by_exact_enumeration_over_the_binomial(nk, p):
    n, k = nk
    mean = sum(
        math.comb(n, c) * p**c * (1 - p) ** (n - c) * pass_at_k_estimate(n, c, k)
        for c in range(n + 1)
    )
    assert abs(mean - pass_at_k(p, k)) < 1e-12, (
        f"E_c~Bin({n},{p})[1 − C(n−c,k)/C(n,k)] = {mean} must equal 1 − (1−p)^{k} = "
        f"{pass_at_k(p, k)}"
    )


def test_the_pass_at_k_estimator_hand_values_and_refusals():
    assert pass_at_k_estimate(10, 0, 3) == 0 and pass_at_k_estimate(10, 8, 3) == 1, (
        "no success: 0; n−c < k: 1"
    )
    assert pass_at_k_estimate(5, 2, 1) == pytest.approx(0.4), "k = 1 is the success rate c/n"
    for bad in ((5, 6, 1), (5, 2, 0), (5, 2, 6)):
        with pytest.raises(ValueError):
            pass_at_k_estimate(*bad)


@SET
@given(case(), st.floats(1e6, 1e18))
def test_the_optimal_value_tends_to_the_reference_reward_at_large_beta(c, beta):
    """β·log Z_β → E_{π_ref}[r] as β → ∞ (log Z_β ≈ E_ref[r]/β): computed without rounding the 1/β
    away."""
    p, r = c
    value = beta * optimum_figures(p, r, beta)["log_z"]
    want = (p * r).sum().item()
    assert abs(value - want) <= 1e-6 * (1 + r.abs().max().item()), (
        f"β={beta:g}: β·log Z {value} vs E_ref[r] {want}"
    )
