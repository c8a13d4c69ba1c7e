"""Each correction's exact bias and variance under lag (grpo_lab.exact.correction_bias), on tiny random answer
trees: against a plain Monte Carlo loop (sampled groups, the kit's whiten, grpo_objective's autograd gradient in
node-logit space) and against known facts."""

import math

import pytest
import torch

from grpo_lab.advantages import whiten
from grpo_lab.config import GRPOConfig
from grpo_lab.exact import correction_bias as cb
from grpo_lab.exact.correction_bias import CORRECTIONS, advantage_table, bias_of, bias_sweep
from grpo_lab.exact.digits_lm import AnswerSpace, token_table
from grpo_lab.objective import grpo_objective, ratio_diagnostics

G, EPS, CAP, FLOOR = 4, 1e-4, 1.5, 0.7


def tree_space(base: int = 2, max_tokens: int = 3) -> AnswerSpace:
    """Y over ``base`` digits + EOS (index ``base``), as :func:`digits_lm.answer_space` lists it for base 10."""
    rows, masks, prefixes = [], [], []
    for m in range(max_tokens + 1):
        for value in range(base**m):
            digits = [(value // base**(m - 1 - i)) % base for i in range(m)]
            rows.append(digits + [base] * (max_tokens - m))
            masks.append([True] * min(m + 1, max_tokens) + [False] * (max_tokens - m - 1))
            prefixes.append([(base**t - 1) // (base - 1) + sum(d * base**(t - 1 - i) for i, d in enumerate(digits[:t]))
                             for t in range(max_tokens)])
    return AnswerSpace(torch.arange(base + 1), torch.tensor(rows), torch.tensor(masks), torch.tensor(prefixes),
                       [str(r) for r in rows])


def random_tree(seed: int, lag_scale: float = 0.8, base: int = 2, max_tokens: int = 3, prompts: int = 1):
    """(space, cond_k, cond_alpha, rewards): random node logits for π_k, α = π_k moved by noise, 0/1 rewards."""
    g = torch.Generator().manual_seed(seed)
    space = tree_space(base, max_tokens)
    nodes = int(space.prefix.max()) + 1
    z_k = torch.randn(prompts, nodes, base + 1, generator=g, dtype=torch.float64)
    z_a = z_k + lag_scale * torch.randn(z_k.shape, generator=g, dtype=torch.float64)
    rewards = (torch.rand(prompts, len(space.texts), generator=g) < 0.4).double()
    rewards[:, 0], rewards[:, -1] = 0.0, 1.0
    return space, z_k.log_softmax(-1), z_a.log_softmax(-1), rewards


def objective_gradient(cond_k, cond_alpha, space, rows, advantages, is_correction, level, weights=None):
    """−∇ of grpo_objective's loss in node-logit space at the first pass (π_θ = π_k), for answers ``rows``."""
    z = cond_k.clone().requires_grad_(True)
    logp = token_table(z.log_softmax(-1), space)[rows]
    mask = space.mask[rows]
    w = mask.double() / len(rows) if weights is None else weights
    loss, _ = grpo_objective(logp, token_table(cond_alpha, space)[rows], advantages, w, logp_k=logp.detach(),
                             level=level, is_correction=is_correction, is_cap=CAP, is_floor=FLOOR)
    (-loss).backward()
    return z.grad.flatten()


def per_answer_gradients(cond_k, cond_alpha, space, is_correction, level):
    """g_c(y) of every answer by autograd through grpo_objective, one answer (A = 1) at a time: ``[N, Π·V]``."""
    return torch.stack([objective_gradient(cond_k, cond_alpha, space, torch.tensor([y]), torch.ones(1),
                                           is_correction, level, space.mask[y:y + 1].double())
                        for y in range(len(space.texts))])


def exact(space, cond_k, cond_alpha, rewards, is_correction, level, **kw):
    return bias_of(cond_k, cond_alpha, rewards, space, is_correction, level, G=G, is_cap=CAP, is_floor=FLOOR,
                   eps_std=EPS, **kw)


def exact_mean(space, cond_k, cond_alpha, rewards, is_correction, level):
    """m from the module's own pieces (the flat node-logit vector)."""
    logp_k, logp_a = token_table(cond_k, space), token_table(cond_alpha, space)
    alpha, p = logp_a.sum(-1).exp(), float(logp_a.sum(-1).exp() @ rewards)
    a_bar = advantage_table(G, EPS) @ cb.binomial_pmf(G - 1, p)
    w, _ = cb.first_pass_weights(logp_k, logp_a, space.mask, is_correction, level, CAP, FLOOR)
    return cb.to_nodes(alpha * a_bar[rewards.long()], cb.answer_gradients(cond_k, space, w), space,
                       cond_k.shape[0])


def monte_carlo(space, cond_k, cond_alpha, rewards, is_correction, level, draws=40_000, seed=0):
    """Sampled groups y_1…y_G ~ α, whitened by the kit, each member's update by autograd: the mean (one backward
    of grpo_objective over every member of every group), the per-sample and the group-mean updates' traces."""
    g = torch.Generator().manual_seed(seed)
    alpha = token_table(cond_alpha, space).sum(-1).exp()
    index = torch.multinomial(alpha, draws * G, replacement=True, generator=g).reshape(draws, G)
    A = whiten(rewards[index], EPS)                                                   # [draws, G]
    rows = index.flatten()
    mean = objective_gradient(cond_k, cond_alpha, space, rows, A.flatten(), is_correction, level)
    grads = per_answer_gradients(cond_k, cond_alpha, space, is_correction, level)
    u = A[:, :1] * grads[index[:, 0]]                                                 # member 1's update
    U = (A[..., None] * grads[index]).mean(1)                                         # the group's mean update
    logp_k, logp_a = token_table(cond_k, space)[rows], token_table(cond_alpha, space)[rows]
    shares = ratio_diagnostics(logp_k, logp_a, space.mask[rows], is_correction, CAP, FLOOR, level)
    return dict(mean=mean, u=u, U=U, grads=grads, shares=shares, rows=rows)


def within(estimate_samples: torch.Tensor, value: float, sigmas: float = 5.0) -> bool:
    """|mean of the samples − value| within ``sigmas`` standard errors."""
    se = float(estimate_samples.std()) / math.sqrt(len(estimate_samples))
    return abs(float(estimate_samples.mean()) - value) <= sigmas * se + 1e-12


@pytest.mark.parametrize("is_correction,level", CORRECTIONS)
def test_exact_sums_match_a_monte_carlo_loop(is_correction, level):
    space, cond_k, cond_alpha, rewards = random_tree(seed=1)
    mc = monte_carlo(space, cond_k[0], cond_alpha[0], rewards[0], is_correction, level)
    res = exact(space, cond_k, cond_alpha, rewards, is_correction, level)
    m = exact_mean(space, cond_k[0], cond_alpha[0], rewards[0], is_correction, level)
    # the mean, per coordinate, within 5 standard errors of the sampled groups' member-1 updates
    se_group = mc["U"].std(0) / math.sqrt(len(mc["U"]))          # the mean over every member of every group
    assert ((mc["mean"] - m).abs() <= 5 * se_group + 1e-12).all(), (mc["mean"] - m).abs() / se_group
    se = mc["u"].std(0) / math.sqrt(len(mc["u"]))                # member 1 alone
    assert ((mc["u"].mean(0) - m).abs() <= 5 * se + 1e-12).all()
    # the per-sample and the group-mean variances: E‖u − m‖² sampled
    assert within(((mc["u"] - m) ** 2).sum(1), res.var)
    assert within(((mc["U"] - m) ** 2).sum(1), res.group_var)
    d = exact_direction(space, cond_k, cond_alpha, rewards)
    assert within(((mc["u"] - m) @ d) ** 2, res.var_along)
    # the shares, against ratio_diagnostics on the sampled tokens (token level: of tokens)
    if level == "token":
        n = space.mask[mc["rows"]].sum()
        for key, value in (("drop_frac", res.drop_share), ("cap_frac", res.cap_share)):
            assert abs(mc["shares"][key] - value) <= 5 * math.sqrt(value * (1 - value) / float(n)) + 1e-12, key


def exact_direction(space, cond_k, cond_alpha, rewards):
    """d = ∇J(π_k)/‖∇J(π_k)‖ by autograd of J(z) = Σ_y π_z(y) r(y)."""
    z = cond_k[0].clone().requires_grad_(True)
    J = token_table(z.log_softmax(-1), space).sum(-1).exp() @ rewards[0]
    J.backward()
    return z.grad.flatten() / z.grad.norm()


@pytest.mark.parametrize("loss_type", ["dr_grpo", "grpo"])
@pytest.mark.parametrize("is_correction,level", CORRECTIONS)
def test_the_exact_mean_is_one_backward_of_the_objective(is_correction, level, loss_type):
    """No sampling: m = −∇ of grpo_objective over all of Y with advantages α(y)·ā(r_y) (token weights λ(y))."""
    space, cond_k, cond_alpha, rewards = random_tree(seed=2)
    ck, ca, r = cond_k[0], cond_alpha[0], rewards[0]
    logp_k, logp_a = token_table(ck, space), token_table(ca, space)
    alpha = logp_a.sum(-1).exp()
    a_bar = advantage_table(G, EPS) @ cb.binomial_pmf(G - 1, float(alpha @ r))
    lam = space.mask.double() / (space.mask.sum(1, keepdim=True) if loss_type == "grpo" else 1)
    rows = torch.arange(len(space.texts))
    expected = objective_gradient(ck, ca, space, rows, alpha * a_bar[r.long()], is_correction, level, lam)
    w, _ = cb.first_pass_weights(logp_k, logp_a, space.mask, is_correction, level, CAP, FLOOR)
    got = cb.to_nodes(alpha * a_bar[r.long()], cb.answer_gradients(ck, space, w, loss_type), space, ck.shape[0])
    assert torch.allclose(got, expected, rtol=1e-10, atol=1e-13)


def test_the_target_is_the_exact_gradient_of_J():
    space, cond_k, cond_alpha, rewards = random_tree(seed=3)
    res = exact(space, cond_k, cond_k, rewards, "ratio", "token")        # lag 0: m = target = κ ∇J
    m = exact_mean(space, cond_k[0], cond_k[0], rewards[0], "ratio", "token")
    d = exact_direction(space, cond_k, cond_alpha, rewards)
    assert torch.allclose(m / m.norm(), d, atol=1e-12) and abs(float(m.norm()) - res.target_norm) < 1e-12


@pytest.mark.parametrize("loss_type", ["dr_grpo"])
def test_at_lag_zero_every_correction_is_unbiased(loss_type):
    space, cond_k, _, rewards = random_tree(seed=4, prompts=2)
    for is_correction, level in CORRECTIONS:
        res = exact(space, cond_k, cond_k, rewards, is_correction, level, loss_type=loss_type)
        assert abs(res.cosine - 1) < 1e-12 and res.rel_error < 1e-12, (is_correction, level)
        assert res.drop_share == res.cap_share == 0.0 and abs(res.whiten_scale - 1) < 1e-12


def test_none_is_biased_by_the_lag_and_more_so_the_larger_it_is():
    errors = []
    for scale in (0.3, 0.6, 1.2):
        space, cond_k, cond_alpha, rewards = random_tree(seed=5, lag_scale=scale)
        res = exact(space, cond_k, cond_alpha, rewards, "none", "token")
        assert res.cosine < 1 - 1e-4 and res.rel_error > 1e-2
        errors.append(res.rel_error)
    assert errors == sorted(errors)


@pytest.mark.parametrize("seed", range(4))
def test_ratio_is_unbiased_on_one_token_answers_at_every_lag(seed):
    """Depth 1 (the bandit): the token ratio is the whole answer's ratio, so E_α[r′ A ∇log π] = κ_α ∇J."""
    space, cond_k, cond_alpha, rewards = random_tree(seed=seed, lag_scale=1.5, base=4, max_tokens=1)
    res = exact(space, cond_k, cond_alpha, rewards, "ratio", "token")
    assert abs(res.cosine - 1) < 1e-12 and res.rel_error < 1e-12
    assert exact(space, cond_k, cond_alpha, rewards, "none", "token").rel_error > 1e-3


def test_the_whole_answer_ratio_is_unbiased_on_sequences_and_token_ratios_are_not():
    """On answers of several tokens, only a weight of the whole answer's Π_t r′_t is unbiased: TRL's sequence
    weights with a band that holds every ρ. The token ratio ignores that α drew the prefix and the rest, and GSPO's
    geometric mean is not the answer's ratio."""
    space, cond_k, cond_alpha, rewards = random_tree(seed=6, lag_scale=1.0)
    wide = dict(is_cap=1e9, is_floor=1e-9)
    for is_correction in ("truncated", "mask", "icepop"):
        res = bias_of(cond_k, cond_alpha, rewards, space, is_correction, "sequence", G=G, eps_std=EPS, **wide)
        assert abs(res.cosine - 1) < 1e-12 and res.rel_error < 1e-10, is_correction
    for level in ("token", "sequence"):
        assert exact(space, cond_k, cond_alpha, rewards, "ratio", level).rel_error > 1e-3


@pytest.mark.parametrize("seed", range(6))
def test_truncation_never_raises_the_mean_square_above_ratio(seed):
    """Token level: min(r′, C) ≤ r′ on every token and the tokens of one answer sit at distinct nodes, so
    E‖u‖² = var + ‖m‖² under truncation is at most ratio's, whatever C (the centred var subtracts a smaller
    ‖m‖², so it is not ordered in general)."""
    space, cond_k, cond_alpha, rewards = random_tree(seed=seed, lag_scale=1.2)
    ratio = exact(space, cond_k, cond_alpha, rewards, "ratio", "token")
    m_ratio = exact_mean(space, cond_k[0], cond_alpha[0], rewards[0], "ratio", "token")
    for cap in (1.05, 1.5, 3.0, 1e9):
        res = bias_of(cond_k, cond_alpha, rewards, space, "truncated", "token", G=G, eps_std=EPS, is_cap=cap)
        trunc_mean = mean_with_cap(space, cond_k[0], cond_alpha[0], rewards[0], cap)
        assert abs(res.mean_norm - float(trunc_mean.norm())) < 1e-12
        assert res.var + float(trunc_mean @ trunc_mean) <= ratio.var + float(m_ratio @ m_ratio) + 1e-12
    assert abs(res.var - ratio.var) < 1e-10        # C above every r′: truncation is the ratio


def test_at_sequence_level_truncation_and_gspos_mean_are_not_ordered():
    """At the sequence level the weights are min(Π_t r′_t, C) and exp(mean_t log r′_t), which no inequality orders:
    on random trees either one has the larger E‖u‖² = var + ‖m‖² (the token-level order above does not carry
    over)."""
    larger = []
    for seed in range(20):
        space, cond_k, cond_alpha, rewards = random_tree(seed=seed, lag_scale=1.2)
        second = {c: r.var + r.mean_norm**2 for c, r in
                  ((c, exact(space, cond_k, cond_alpha, rewards, c, "sequence")) for c in ("ratio", "truncated"))}
        larger.append(second["truncated"] > second["ratio"])
    assert 0 < sum(larger) < len(larger), larger


def test_token_ratios_are_unbiased_when_alpha_moved_only_where_the_reward_is_decided():
    """Token ratios are biased on answers of several tokens in general, not always: where α differs from π_k only
    at the root and the first token decides the reward, a deeper token's weight is 1 and its expected score is 0
    whatever the prefix, on- and off-policy, so ``ratio`` is exact. Let the reward depend on the second token and
    the bias is back."""
    space, cond_k, _, _ = random_tree(seed=10)
    g = torch.Generator().manual_seed(10)
    cond_alpha = cond_k.clone()
    cond_alpha[:, 0] = (cond_k[:, 0] + torch.randn(cond_k[:, 0].shape, generator=g, dtype=torch.float64)
                        ).log_softmax(-1)
    first, second = space.tokens[:, 0], space.tokens[:, 1]
    by_first = (first == 0).double()[None]
    ratio = exact(space, cond_k, cond_alpha, by_first, "ratio", "token")
    assert ratio.rel_error < 1e-12 and abs(ratio.cosine - 1) < 1e-12
    assert exact(space, cond_k, cond_alpha, by_first, "none", "token").rel_error > 1e-3   # α did move
    by_second = ((first != 2) & (second == 0)).double()[None]
    assert exact(space, cond_k, cond_alpha, by_second, "ratio", "token").rel_error > 1e-3


def mean_with_cap(space, cond_k, cond_alpha, rewards, cap):
    logp_k, logp_a = token_table(cond_k, space), token_table(cond_alpha, space)
    alpha = logp_a.sum(-1).exp()
    a_bar = advantage_table(G, EPS) @ cb.binomial_pmf(G - 1, float(alpha @ rewards))
    w, _ = cb.first_pass_weights(logp_k, logp_a, space.mask, "truncated", "token", cap)
    return cb.to_nodes(alpha * a_bar[rewards.long()], cb.answer_gradients(cond_k, space, w), space, cond_k.shape[0])


def test_a_wrong_weight_fails_the_monte_carlo_check(monkeypatch):
    """The Monte Carlo comparison can fail: a weight 10% off on the capped tokens is caught."""
    space, cond_k, cond_alpha, rewards = random_tree(seed=1)
    mc = monte_carlo(space, cond_k[0], cond_alpha[0], rewards[0], "truncated", "token")
    real = cb.is_correction_terms

    def wrong(*args, **kw):
        base, c = real(*args, **kw)
        return base, torch.where(c >= CAP, 1.1 * c, c)

    monkeypatch.setattr(cb, "is_correction_terms", wrong)
    m = exact_mean(space, cond_k[0], cond_alpha[0], rewards[0], "truncated", "token")
    se = mc["U"].std(0) / math.sqrt(len(mc["U"]))
    assert not ((mc["mean"] - m).abs() <= 5 * se + 1e-12).all()


def test_the_sweep_reads_the_config_and_refuses_a_random_denominator():
    space, cond_k, cond_alpha, rewards = random_tree(seed=7)
    config = GRPOConfig(G=G, eps_std=EPS, is_cap=CAP, is_floor=FLOOR)
    sweep = bias_sweep([cond_alpha, cond_k], cond_alpha, rewards, space, config)
    assert list(sweep) == [0, 1] and [r.name for r in sweep[1]][:2] == ["ratio", "truncated"]
    assert sweep[1][1] == exact(space, cond_k, cond_alpha, rewards, "truncated", "token")
    assert sweep[0][4].rel_error < 1e-12
    with pytest.raises(ValueError, match="unmasked"):
        bias_sweep([cond_k], cond_alpha, rewards, space, config.replace(mask_normalize="unmasked"))
    with pytest.raises(ValueError, match="0/1"):
        bias_of(cond_k, cond_alpha, rewards * 0.5, space, "ratio")


def test_trls_default_is_its_own_row_and_drops_only_the_answers_above_3():
    """TRL 1.16's default is ``sequence_mask`` with clip_max 3 and no clip_min (its stock config, read here), not
    the band [1/2, 2] of ``mask · seq``: the sweep's last row. It drops exactly the answers whose Π_t r′_t > 3, the
    share truncation at C = 3 caps, a subset of those truncation at C = 2 caps; ``mask · seq`` at C = 2 also drops
    the answers below 1/2, so it drops more."""
    import trl

    from grpo_lab.scale.knobs import trl_correction_arguments

    stock = trl.GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none")
    trl_knobs = {k: v for k, v in cb.TRL_DEFAULT.items() if k != "level"}
    arguments = trl_correction_arguments(GRPOConfig(**trl_knobs, is_level=cb.TRL_DEFAULT["level"]))
    for name in ("importance_sampling_level", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                 "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"):
        assert arguments[name] == getattr(stock, name), name
    space, cond_k, cond_alpha, rewards = random_tree(seed=9, lag_scale=1.0)
    sweep = bias_sweep([cond_alpha, cond_k], cond_alpha, rewards, space, GRPOConfig(G=G, eps_std=EPS, is_cap=2.0))
    by = {r.name: r for r in sweep[1]}
    trl_row = sweep[1][-1]
    assert trl_row.name == cb.TRL_DEFAULT_NAME and (trl_row.is_correction, trl_row.level) == ("icepop", "sequence")
    assert trl_row == bias_of(cond_k, cond_alpha, rewards, space, G=G, eps_std=EPS, label=cb.TRL_DEFAULT_NAME,
                              **cb.TRL_DEFAULT)
    above = {cap: bias_of(cond_k, cond_alpha, rewards, space, "truncated", "sequence", G=G, eps_std=EPS,
                          is_cap=cap).cap_share for cap in (2.0, 3.0)}
    assert trl_row.drop_share == pytest.approx(above[3.0], abs=1e-12) and 0 < above[3.0] < above[2.0]
    assert by["mask · seq"].drop_share > by["mask · seq"].cap_share == pytest.approx(above[2.0], abs=1e-12)
    assert by["mask · seq"].drop_share > trl_row.drop_share
    assert sweep[0][-1].rel_error < 1e-12                                    # lag 0: unbiased as every row


def test_truncation_can_raise_the_centred_variance_a_little():
    """The centred trace is not ordered: on this one-token tree (found by a scan of random trees) truncating at
    C = 1.05 lowers E‖u‖² but lowers ‖m‖² more, so its variance ends above ratio's."""
    space, cond_k, cond_alpha, rewards = random_tree(seed=4, lag_scale=0.5, max_tokens=1)
    ratio = exact(space, cond_k, cond_alpha, rewards, "ratio", "token")
    trunc = bias_of(cond_k, cond_alpha, rewards, space, "truncated", "token", G=G, eps_std=EPS, is_cap=1.05)
    assert trunc.var > ratio.var * (1 + 1e-3)
    m_ratio = exact_mean(space, cond_k[0], cond_alpha[0], rewards[0], "ratio", "token")
    m_trunc = mean_with_cap(space, cond_k[0], cond_alpha[0], rewards[0], 1.05)
    assert trunc.var + float(m_trunc @ m_trunc) < ratio.var + float(m_ratio @ m_ratio)


def test_the_weight_exercise_and_the_choice_check(capsys):
    from grpo_lab.viz.exercises import SOLUTIONS, ExerciseMismatch, check, check_choice

    assert check("correction_weight", SOLUTIONS["correction_weight"]) == "yours"

    def no_floor(logp_k, logp_alpha, mask, is_correction, is_cap, is_floor):   # a mask that forgets the floor
        w = SOLUTIONS["correction_weight"](logp_k, logp_alpha, mask, is_correction, is_cap, is_floor)
        rho = torch.exp(logp_k - logp_alpha) * mask
        return torch.where((w == 0) & (rho <= is_cap), rho, w)

    with pytest.raises(ExerciseMismatch, match="correction_weight"):
        check("correction_weight", no_floor)
    options = ("ratio", "none", "all")
    assert check_choice("q", None, "all", options) == "no prediction"
    assert "the run gave" not in capsys.readouterr().out                     # not revealed before a guess
    assert check_choice("q", "all", {"all"}, options) == "✓" and check_choice("q", "ratio", "all", options) == "✗"
    with pytest.raises(ValueError, match="one of"):
        check_choice("q", "ratios", "all", options)


def test_the_figure_names_each_correction_and_titles_every_axis():
    space, cond_k, cond_alpha, rewards = random_tree(seed=8)
    sweep = bias_sweep([cond_alpha, cond_k], cond_alpha, rewards, space, GRPOConfig(G=G))
    fig = cb.bias_figure(sweep, lag=1)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == [r.name for r in sweep[0]] + ["lag 1"]
    assert all(axis.title.text for axis in (fig.layout.xaxis, fig.layout.xaxis2, fig.layout.yaxis, fig.layout.yaxis2))
    styles = {(t.line.color, t.line.dash, t.marker.symbol) for t in fig.data if t.name != "lag 1"}
    assert len(styles) == len(CORRECTIONS) + 1                                # and TRL's default, a style of its own
    assert len(cb.bias_figure(sweep).data) == len(fig.data)                   # the same traces, for a panel's update
