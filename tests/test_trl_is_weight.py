"""What TRL 1.16's vLLM importance weight is (docs/theory.md §3 and §5), on TRL's own code path.

Stock ``trl.GRPOTrainer`` trains a tiny random Llama; a stand-in for its vLLM engine (the two methods the trainer
calls, ``sync_weights`` and ``generate``) holds its own copy α of the weights and returns, for each sampled token,
log α plus a controlled offset δ: the engine's numerical mismatch. TRL itself computes the weight
(``_generate_and_score_completions``:
``per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask``,
summed per sequence in the default ``sequence_mask`` mode, then ``torch.exp``) and multiplies the clipped loss by it
(``_compute_loss``: ``per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]``).

Each value of the kit's ``is_correction`` is then run on TRL's side, through the arguments
:func:`grpo_lab.scale.knobs.trl_correction_arguments` maps it to (every ``vllm_importance_sampling_mode``, the
two-sided ``vllm_importance_sampling_clip_min``, TRL's default with its clip per token and its correction per
sequence, and β with the KL weighted or not), with an engine whose mismatch differs from token to token: TRL's
weight, loss and gradient equal the kit's on the same batch, at every optimiser step. Where the mapping refuses
(β > 0 with TRL's KL weight under ``ratio`` or at ``level="sequence"``), TRL's loss is the kit's with its KL weight
replaced by TRL's π_θ/π_old, per token or per sequence, and not the kit's.
"""

import copy

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer
from trl_two_process import TRAIN_PROMPTS, build_tiny_model

from grpo_lab.config import GRPOConfig
from grpo_lab.objective import (
    clipped_surrogate,
    grpo_objective,
    is_correction_terms,
    kl_estimate,
    loss_weights,
    sequence_log_ratio,
    weighted_sum,
)
from grpo_lab.plan import ObjectiveArgs
from grpo_lab.scale.knobs import TRL_IS_MODES, trl_correction_arguments

S, STEPS, G = 2, 4, 4  # steps_per_generation = 2 optimiser steps per generation, so step 1 of each is lagged


class Engine:
    """Stands in for TRL's ``VLLMGeneration``. ``sync_weights`` copies π_θ into α (TRL calls it before a generation
    whenever ``global_step`` moved: ``_generate_single_turn``); ``generate`` returns fixed completions of 3–5 tokens
    and log α + δ for each token, as vLLM's ``logprobs`` (one per token): δ = ``mismatch``, plus ``spread`` times a
    fixed pattern in [−1, 1] over completions j and tokens t (so r′ = e^−δ varies from token to token)."""

    def __init__(self, model: torch.nn.Module, mismatch: float, spread: float = 0.0):
        self.model, self.alpha, self.mismatch, self.pushes = model, copy.deepcopy(model), mismatch, 0
        self.spread = spread

    def sync_weights(self) -> None:
        self.alpha.load_state_dict(self.model.state_dict())
        self.pushes += 1

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], images, num_generations: int, profiler=None):
        completions = [[2 + (j + 3 * t) % 14 for t in range(3 + j % 3)] for j in range(len(prompts))]
        logprobs = []
        for j, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            logits = self.alpha(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1]
            logp = logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)
            pattern = [((5 * j + 3 * t) % 7 - 3) / 3 + (j % 5 - 2) / 2 for t in range(len(completion))]
            logprobs.append([[float(x) + self.mismatch + self.spread * p] for x, p in zip(logp, pattern, strict=True)])
        return prompts, completions, logprobs, None


def alternating_reward(completions, **kwargs):
    """Half of every group right: every step trains, so π_θ leaves the weights of the generation."""
    return [float(j % 2) for j in range(len(completions))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama"))


def trl_trainer(model_dir: str, out: str, mismatch: float, spread: float = 0.0,
                **trl_args) -> tuple[GRPOTrainer, Engine]:
    """Stock GRPOTrainer, built without vLLM, then given the engine above: the vLLM branches of TRL's own code run.
    ``trl_args``: more of TRL's own arguments (its importance-sampling mode and bounds)."""
    config = TRLGRPOConfig(output_dir=out, per_device_train_batch_size=G, gradient_accumulation_steps=1,
                        steps_per_generation=S, num_generations=G, max_completion_length=8, learning_rate=0.05,
                        loss_type="grpo", max_steps=STEPS, logging_steps=1, report_to="none",
                        save_strategy="no", use_cpu=True, bf16=False, disable_tqdm=True, seed=0, **trl_args)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=alternating_reward, args=config,
                          train_dataset=Dataset.from_dict({"prompt": list(TRAIN_PROMPTS)}))
    engine = Engine(trainer.model, mismatch, spread)
    trainer.use_vllm, trainer.vllm_mode, trainer.vllm_generation = True, "colocate", engine
    trainer._last_loaded_step = -1  # as TRL's __init__ sets it with vLLM: the first generation pushes
    return trainer, engine


def current_logps(trainer: GRPOTrainer, inputs: dict, grad: bool = False) -> torch.Tensor:
    """log π_θ of the batch's completion tokens at the weights of this optimiser step (π_k), TRL's own forward;
    with ``grad``, differentiable in the weights."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.set_grad_enabled(grad):
        return trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                          inputs["completion_ids"].size(1))[0]


def gradient(trainer: GRPOTrainer, loss: torch.Tensor) -> torch.Tensor:
    """∇ of ``loss`` in the trainable weights, flat (the graph kept: TRL's own backward follows)."""
    weights = [p for p in trainer.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, weights, retain_graph=True, allow_unused=True)
    return torch.cat([torch.zeros(p.numel()) if g is None else g.flatten() for p, g in zip(weights, grads)])


def train_and_record(trainer: GRPOTrainer, losses: dict | None = None) -> list[dict]:
    """Each optimiser step's TRL weight (None with TRL's correction off), π_old, log α as the engine returned it,
    π_k, the mask, TRL's advantages, log π_ref (None at β = 0) and the loss TRL's ``_compute_loss`` returned, with
    its gradient. Given ``losses`` (name → ``loss_of(s, logp)``, a loss from a step's record ``s`` and a
    differentiable log π_θ), also each one's value and gradient, at the weights TRL's step is taken at."""
    seen, compute_loss = [], trainer._compute_loss

    def recorded(model, inputs):
        weight, ref = inputs.get("importance_sampling_ratio"), inputs.get("ref_per_token_logps")
        s = {"step": trainer.state.global_step, "weight": None if weight is None else weight.clone(),
             "old": inputs["old_per_token_logps"].clone(), "engine": inputs["sampling_per_token_logps"].clone(),
             "pi_k": current_logps(trainer, inputs), "mask": inputs["completion_mask"].bool(),
             "advantages": inputs["advantages"].clone(), "ref": None if ref is None else ref.clone()}
        loss = compute_loss(model, inputs)
        s |= {"loss": float(loss.detach()), "grad": gradient(trainer, loss)}
        for name, loss_of in (losses or {}).items():
            other = loss_of(s, current_logps(trainer, inputs, grad=True))
            s |= {f"{name}_loss": float(other.detach()), f"{name}_grad": gradient(trainer, other)}
        seen.append(s)
        return loss

    trainer._compute_loss = recorded
    trainer.train()
    return seen


@pytest.mark.parametrize("mismatch", [0.0, 0.05])
def test_the_default_weight_moves_with_the_engine_mismatch_and_not_with_the_lag(model_dir, tmp_path, mismatch):
    """Default ``sequence_mask``: one weight per sequence, exp(Σ_t (log π_old − log α_engine)) = exp(−δ·L_b), the same
    at the step right after a generation and at the next one, where π_θ has moved (π_k ≠ π_old, the lag that the
    kit's r′ = π_k/α carries). TRL pushes before every generation, so π_old and α share weights: the weight sees
    only the engine's δ. The old text (TRL's weight is the detached r′ = π_k/α) fails on the lagged steps."""
    trainer, engine = trl_trainer(model_dir, str(tmp_path / "out"), mismatch)
    assert trainer.vllm_importance_sampling_mode == "sequence_mask" and trainer.vllm_importance_sampling_clip_max == 3
    seen = train_and_record(trainer)
    assert [s["step"] for s in seen] == list(range(STEPS))
    assert engine.pushes == STEPS // S  # one push per generation
    lag_seen = []
    for s in seen:
        lengths = s["mask"].sum(1)
        assert s["weight"].shape == (len(lengths), 1)  # one number per sequence, applied to every token
        assert torch.allclose(s["weight"][:, 0], torch.exp(-mismatch * lengths.double()).float(), atol=1e-5)
        alpha = s["engine"] - mismatch  # log α at the pushed weights
        assert (s["old"] - alpha)[s["mask"]].abs().max() < 1e-5  # π_old: the trainer's forward at those weights
        r_prime = torch.exp(((s["pi_k"] - alpha) * s["mask"]).sum(1))  # the kit's sequence r′ = π_k/α
        lag_seen.append(float((r_prime - 1).abs().max()))
        if s["step"] % S == 0:  # right after a generation: π_k = π_old, no lag
            assert lag_seen[-1] < 1e-4
    lagged = [gap for s, gap in zip(seen, lag_seen, strict=True) if s["step"] % S]
    assert min(lagged) > 0.02, lag_seen  # the lag is there (π_k ≠ π_old), and TRL's weight did not move with it
    if mismatch:
        assert all(float(s["weight"].max()) < 0.9 for s in seen)  # δ = 0.05 on ≥ 3 tokens: ≤ exp(−0.15)


def test_token_weights_on_one_token_responses_give_the_multiplicative_band(model_dir, tmp_path):
    """TRL's ``_compute_loss`` fed a per-token weight w = π_old/α and ρ = π_θ/π_old on one-token responses:
    w·min(ρA, clip(ρ)A) is the multiplicative band of the kit's ``clipped_surrogate`` around r′ = w (``token_*``
    modes, or one token per response). What notebook 01 §2's dashed TRL curves draw, checked on TRL's code."""
    trainer, _ = trl_trainer(model_dir, str(tmp_path / "out"), 0.0)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train; one micro-batch here
    B = 8
    generator = torch.Generator().manual_seed(0)
    inputs = {"prompt_ids": torch.tensor([[2, 3, 4]] * B), "prompt_mask": torch.ones(B, 3, dtype=torch.long),
              "completion_ids": torch.arange(5, 5 + B)[:, None], "completion_mask": torch.ones(B, 1, dtype=torch.long),
              "advantages": torch.tensor([1.0, -1.0] * (B // 2))}
    logp = current_logps(trainer, inputs)
    log_rho = 0.6 * torch.randn(B, 1, generator=generator)  # π_θ/π_old: inside and outside [1 − ε, 1 + ε]
    log_w = 0.8 * torch.randn(B, 1, generator=generator)  # π_old/α = r′
    inputs |= {"old_per_token_logps": logp - log_rho, "importance_sampling_ratio": log_w.exp()}
    trainer.model.train()
    loss = trainer._compute_loss(trainer.model, inputs)
    band = clipped_surrogate(logp, logp - log_rho, logp - log_rho - log_w, inputs["advantages"][:, None],
                             trainer.args.epsilon, band="multiplicative")
    assert torch.allclose(loss.detach(), -band.mean(), atol=1e-6)
    assert (log_rho.abs() > 0.2).any() and (log_w.exp() > 1.5).any()  # the clip and a weight far from 1 both act


TRL_DEFAULT = "TRL's default: sequence_mask, clip_max 3, no clip_min, token clip"
TRL_MODES = {  # TRL's mode (and bounds) → the kit's knobs that map to it; the clip's level is TRL's
    # importance_sampling_level, the correction's the prefix of TRL's mode
    "token_truncate": dict(is_correction="truncated", is_cap=1.5),
    "sequence_truncate, sequence clip": dict(is_correction="truncated", is_cap=2.0, level="sequence"),
    "token_truncate, sequence clip": dict(is_correction="truncated", is_cap=1.5, level="sequence", is_level="token"),
    "token_mask": dict(is_correction="mask", is_cap=1.5),
    "sequence_mask, sequence clip": dict(is_correction="mask", is_cap=2.0, level="sequence"),
    "token_mask, clip_min (IcePop)": dict(is_correction="icepop", is_cap=2.0, is_floor=0.7),
    "sequence_mask, clip_min (IcePop), sequence clip": dict(is_correction="icepop", is_cap=4.0, is_floor=0.4,
                                                            level="sequence"),
    TRL_DEFAULT: dict(
        is_correction="icepop", is_cap=3.0, is_floor=None, is_level="sequence"),
    "sequence_mask, clip_max 3, no clip_min, sequence clip": dict(is_correction="icepop", is_cap=3.0, is_floor=None,
                                                                  level="sequence"),
    "token_mask, no bounds (ratio, multiplicative band)": dict(is_correction="ratio", band="multiplicative"),
    "correction off (none)": dict(is_correction="none"),
}
SPREAD = 0.6  # the engine's δ ∈ [−1.2, 1.2]: token r′ ∈ [0.3, 3.3], sequence r′ over 3–5 tokens far wider
BETA = 0.3
KL_SETTINGS = {  # β and the KL weight: TRL's use_bias_correction_kl is the kit's kl_weight_differentiable
    "beta 0": dict(beta=0.0),
    "beta > 0, KL weighted (TRL's default)": dict(beta=BETA, kl_weight_differentiable=True),
    "beta > 0, KL unweighted": dict(beta=BETA),
}


def refused(mode: str, kl: str) -> bool:
    """Where TRL's KL weight π_θ/π_old (per token, or one per sequence at importance_sampling_level "sequence")
    is not the kit's π_θ/base per token (base = α under ``ratio``): β > 0, the KL weighted, and ``ratio`` or the
    clip at sequence level."""
    knobs = {**TRL_MODES[mode], **KL_SETTINGS[kl]}
    return (knobs["beta"] > 0 and knobs.get("kl_weight_differentiable", False)
            and (knobs["is_correction"] == "ratio" or knobs.get("level") == "sequence"))


CASES = [(mode, kl) for mode in TRL_MODES for kl in KL_SETTINGS]
WEIGHTED = "beta > 0, KL weighted (TRL's default)"


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ relative to ‖a‖ (at least 1e-12), the gradients' distance."""
    return float((a - b).norm()) / max(float(a.norm()), 1e-12)


def test_every_correction_value_has_a_trl_row_and_the_default_is_trls():
    """One row per value; TRL 1.16's own defaults are ``sequence_mask``, clip_max 3, no clip_min (its docstring
    says ``token_truncate``), at ``importance_sampling_level="token"``, β = 0 and ``use_bias_correction_kl``: the
    row of icepop with the clip per token, the weight per sequence (``is_level``), C = 3, no floor. Every argument
    equals the stock config's, the clip's level included."""
    from grpo_lab.objective import IS_CORRECTIONS
    assert [row.value for row in TRL_IS_MODES] == list(IS_CORRECTIONS)
    stock = TRLGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none")
    default = trl_correction_arguments(GRPOConfig(**TRL_MODES[TRL_DEFAULT], kl_weight_differentiable=True))
    assert {name: getattr(stock, name) for name in default} == default
    assert default["importance_sampling_level"] == "token"
    assert default["vllm_importance_sampling_mode"] == "sequence_mask"
    assert stock.vllm_importance_sampling_clip_min is None and stock.use_bias_correction_kl and stock.beta == 0
    with pytest.raises(ValueError, match="is_correction = 'ratio' with level = 'sequence'"):
        trl_correction_arguments(GRPOConfig(is_correction="ratio", level="sequence", band="multiplicative"))
    with pytest.raises(ValueError, match="band = 'additive' has no TRL equal"):
        trl_correction_arguments(GRPOConfig(is_correction="ratio"))
    with pytest.raises(ValueError, match="is_level = 'sequence' differs from level = 'token', but is_correction = "):
        GRPOConfig(is_correction="ratio", is_level="sequence")


@pytest.mark.parametrize(("mode", "kl"), CASES)
def test_the_mapping_refuses_exactly_where_trls_kl_weight_is_not_the_kits(mode, kl):
    """At β > 0 with the KL weighted, TRL weights it by π_θ/π_old (a sequence's at importance_sampling_level
    "sequence"), the kit by π_θ/base per token: the mapping refuses ``ratio`` (base α) and the sequence-level clip
    there, and nothing else; at β > 0 the KL's arguments are the kit's β and weight. The detached weight and the
    other estimators have no TRL equal."""
    knobs = GRPOConfig(**TRL_MODES[mode], **KL_SETTINGS[kl])
    if refused(mode, kl):
        with pytest.raises(ValueError, match="kl_weight_differentiable = True at beta = 0.3 .* has no TRL equal"):
            trl_correction_arguments(knobs)
    else:
        arguments = trl_correction_arguments(knobs)
        assert (arguments["beta"], arguments["use_bias_correction_kl"]) == (knobs.beta, knobs.kl_weight_differentiable)
    if knobs.beta > 0:
        with pytest.raises(ValueError, match="kl_kind = 'k2' at beta = 0.3 has no TRL equal"):
            trl_correction_arguments(knobs.replace(kl_kind="k2"))
        with pytest.raises(ValueError, match="kl_importance_weighted = True at beta = 0.3 has no TRL equal"):
            trl_correction_arguments(knobs.replace(kl_importance_weighted=True, kl_weight_differentiable=False))


def kit_loss(trainer: GRPOTrainer, knobs: GRPOConfig):
    """grpo_objective's loss on a recorded TRL step: π_θ, π_old as π_k, the engine's log-probs as log α, TRL's
    advantages, π_ref and its ε, the grpo weights of the micro-batch."""
    args = ObjectiveArgs.of(knobs.replace(eps_low=trainer.args.epsilon, eps_high=trainer.args.epsilon_high))

    def loss_of(s: dict, logp: torch.Tensor) -> torch.Tensor:
        return grpo_objective(logp, s["engine"], s["advantages"], loss_weights(s["mask"]), logp_k=s["old"],
                              logp_ref=s["ref"], **args.kwargs())[0]

    return loss_of


@pytest.mark.parametrize(("mode", "kl"), [case for case in CASES if not refused(*case)])
def test_trls_weight_loss_and_gradient_equal_the_kits_for_each_mode(model_dir, tmp_path, mode, kl):
    """Stock GRPOTrainer with the arguments the kit's knobs map to (``trl_correction_arguments``) trains 4 optimiser
    steps on an engine whose mismatch varies per token. At every step, TRL's ``importance_sampling_ratio`` is the
    kit's c = ``is_correction_terms`` of π_old/α (per token, or per sequence from ``sequence_log_ratio`` at the
    correction's level) and the loss and gradient of TRL's ``_compute_loss`` are ``grpo_objective``'s on the same
    batch: π_θ, π_old as π_k, the engine's log-probs as log α, TRL's advantages and π_ref, the grpo weights. At the
    lagged steps (every second one) π_θ ≠ π_old, so the clip is in the comparison too, at its own level. The batch
    has weights on both sides of each bound (asserted): a wrong bound, a mean in place of TRL's sum, a cap in place
    of a mask, or the correction's level moved with the clip's would fail."""
    knobs = GRPOConfig(**TRL_MODES[mode], **KL_SETTINGS[kl])
    arguments = trl_correction_arguments(knobs)
    trainer, _ = trl_trainer(model_dir, str(tmp_path / "out"), 0.0, SPREAD, **arguments)
    seen = train_and_record(trainer, {"kit": kit_loss(trainer, knobs)})
    assert len(seen) == STEPS
    is_level = knobs.is_level or knobs.level
    weights = []
    for s in seen:
        mask = s["mask"]
        assert (s["ref"] is not None) == (knobs.beta > 0)
        log_rho = sequence_log_ratio(s["old"], s["engine"], mask) if is_level == "sequence" else None
        _, c = is_correction_terms(s["old"], s["engine"], knobs.is_correction, knobs.is_cap, knobs.is_floor, log_rho)
        if s["weight"] is None:
            assert not arguments["vllm_importance_sampling_correction"] and c is None
        else:
            kit = (s["old"] - s["engine"]).exp() if c is None else c  # ratio: c = 1 against α is r′ itself
            assert s["weight"].shape == kit.shape
            on = mask if kit.shape == mask.shape else torch.ones_like(kit, dtype=torch.bool)
            torch.testing.assert_close(s["weight"][on], kit[on], rtol=1e-5, atol=1e-6)
            weights.append(s["weight"][on])
        assert s["kit_loss"] == pytest.approx(s["loss"], rel=1e-5, abs=1e-6), s["step"]
        assert gap(s["grad"], s["kit_grad"]) < 1e-5, s["step"]
    if weights:
        w = torch.cat(weights)
        if knobs.is_correction == "truncated":
            assert (w == knobs.is_cap).any() and (w < knobs.is_cap).any()  # the cap binds on some, not all
        if knobs.is_correction in ("mask", "icepop"):
            assert (w == 0).any() and (w > 0).any()  # the band drops some, keeps others
            low = 1 / knobs.is_cap if knobs.is_correction == "mask" else knobs.is_floor
            if low is not None:
                raw = torch.cat([sequence_log_ratio(s["old"], s["engine"], s["mask"])[:, 0] if is_level == "sequence"
                                 else (s["old"] - s["engine"])[s["mask"]] for s in seen]).exp()
                assert (raw < low).any() and (raw > knobs.is_cap).any()  # both bounds drop something
    lagged = [s for s in seen if s["step"] % S]
    assert max(float((s["pi_k"] - s["old"])[s["mask"]].abs().max()) for s in lagged) > 0.02  # π_θ ≠ π_old


def trls_kl_weight(trainer: GRPOTrainer, knobs: GRPOConfig):
    """The loss TRL computes where the mapping refuses: the kit's at β = 0 plus β·Σ w·k3·ρ, with TRL's
    ``coef_1`` ρ = π_θ/π_old per token, or exp(mean_t log π_θ/π_old) per sequence at level sequence, with its
    gradient (``_compute_loss``: ``per_token_kl = per_token_kl * coef_1``)."""
    surrogate = kit_loss(trainer, knobs.replace(beta=0.0, kl_weight_differentiable=False))

    def loss_of(s: dict, logp: torch.Tensor) -> torch.Tensor:
        log_rho = torch.where(s["mask"], logp - s["old"], torch.zeros_like(logp))
        if knobs.level == "sequence":
            log_rho = (log_rho.sum(1, keepdim=True) / s["mask"].sum(1, keepdim=True).clamp(min=1)).expand_as(logp)
        kl = kl_estimate(logp, s["ref"], "k3") * log_rho.exp()
        return surrogate(s, logp) + knobs.beta * weighted_sum(kl, loss_weights(s["mask"]))

    return loss_of


@pytest.mark.parametrize("mode", ["token_mask, no bounds (ratio, multiplicative band)", "sequence_mask, sequence clip"])
def test_where_the_mapping_refuses_trl_weights_the_kl_by_pi_old_not_the_kits_base(model_dir, tmp_path, mode):
    """``ratio`` (TRL ``token_mask`` without bounds) and a sequence-level clip, at β > 0 with TRL's
    ``use_bias_correction_kl``: stock GRPOTrainer, given the arguments of the unweighted KL with the weight switched
    on, computes the kit's surrogate plus β·k3 weighted by its ``coef_1`` (π_θ/π_old per token; at the sequence
    level exp(mean_t log π_θ/π_old), one per sequence), in loss and gradient at every step; not the kit's loss with
    ``kl_weight_differentiable=True``, whose weight is π_θ/α per token under ``ratio`` (the engine's mismatch parts
    the values even where π_θ = π_old) and π_θ/π_k per token at the sequence level (the same value right after a
    generation, another gradient)."""
    assert refused(mode, WEIGHTED)
    knobs = GRPOConfig(**TRL_MODES[mode], **KL_SETTINGS[WEIGHTED])
    arguments = trl_correction_arguments(knobs.replace(kl_weight_differentiable=False))
    arguments["use_bias_correction_kl"] = True
    trainer, _ = trl_trainer(model_dir, str(tmp_path / "out"), 0.0, SPREAD, **arguments)
    seen = train_and_record(trainer, {"trl_kl": trls_kl_weight(trainer, knobs), "kit": kit_loss(trainer, knobs)})
    for s in seen:
        assert s["trl_kl_loss"] == pytest.approx(s["loss"], rel=1e-5, abs=1e-6), s["step"]
        assert gap(s["grad"], s["trl_kl_grad"]) < 1e-5, s["step"]
        if s["step"] == 0:  # π_θ = π_ref: k3 and its weighted gradient (log π_θ − log π_ref)·∇log π are 0
            continue
        assert gap(s["grad"], s["kit_grad"]) > 1e-3, s["step"]
        if knobs.is_correction == "ratio":
            assert abs(s["kit_loss"] - s["loss"]) > 1e-4, s["step"]
