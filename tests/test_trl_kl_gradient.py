"""TRL 1.16's KL gradient at β > 0 (docs/theory.md §3, *KL estimators are loss terms*), on TRL's own code path.

Stock ``trl.GRPOTrainer`` with its default settings but β > 0 (``loss_type="dapo"``, ``use_bias_correction_kl=True``,
token-level ratios) computes k3 and multiplies it by ``coef_1 = exp(log π_θ − log π_old)``, **not detached**
(``_compute_loss``: ``per_token_kl = per_token_kl * coef_1``). So its KL term's gradient is
(π_θ/π_old)·(k3 + 1 − π_ref/π_θ)·∇log π = (π_θ/π_old)·(log π_θ − log π_ref)·∇log π, the reverse KL's, and it
differs from the detached weight's (k3's forward-KL gradient) even on-policy, where the weight's value is 1. The kit
gives TRL's gradient with ``kl_weight_differentiable=True`` (the adapter's ``use_bias_correction_kl``), and its
detached ``kl_importance_weighted`` does not.
"""

import warnings
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer
from trl_two_process import TRAIN_PROMPTS, build_tiny_model

from grpo_lab import GRPOConfig, grpo_objective
from grpo_lab.objective import loss_weights
from grpo_lab.scale.knobs import trl_values, validate_trl_values

B, P_LEN, T = 8, 3, 5
BETA = 0.3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def trainer(model_dir, tmp_path_factory):
    """Stock GRPOTrainer, TRL's defaults except β > 0 (and the CPU/float32 plumbing)."""
    config = TRLGRPOConfig(output_dir=str(tmp_path_factory.mktemp("out")), beta=BETA, per_device_train_batch_size=B,
                       num_generations=4, max_completion_length=T, report_to="none", save_strategy="no",
                       use_cpu=True, bf16=False, disable_tqdm=True, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model_dir, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=config, train_dataset=Dataset.from_dict({"prompt": list(TRAIN_PROMPTS)}))
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train; one micro-batch here
    trainer.model.train()
    return trainer


def fixed_batch(off_policy: bool) -> dict:
    """B completions of lengths 2…5 (padding after), advantages of both signs; log π_old and log π_ref perturbed
    from π_θ by a set seed (``off_policy``: π_old ≠ π_θ, so ρ ≠ 1 and the clip acts; else TRL's own on-policy
    path, ``old_per_token_logps`` absent and π_old = π_θ detached)."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, 4, 3, 2, 5, 3, 4, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    batch = {"prompt_ids": torch.randint(2, 16, (B, P_LEN), generator=generator),
             "prompt_mask": torch.ones(B, P_LEN, dtype=torch.long),
             "completion_ids": torch.randint(2, 16, (B, T), generator=generator) * mask,
             "completion_mask": mask, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 0.0, 0.8]),
             "num_items_in_batch": mask.sum()}
    batch["_ref_shift"] = 0.7 * torch.randn(B, T, generator=generator)
    batch["_old_shift"] = 0.3 * torch.randn(B, T, generator=generator) if off_policy else None
    return batch


def logps(trainer, batch) -> torch.Tensor:
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    return trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)[0]


def gradient(trainer, loss: torch.Tensor) -> torch.Tensor:
    grads = torch.autograd.grad(loss, [p for p in trainer.model.parameters() if p.requires_grad], allow_unused=True)
    return torch.cat([torch.zeros(0) if g is None else g.flatten() for g in grads])


def trl_and_kit_gradients(trainer, off_policy: bool, **kit_options) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's gradient from its own ``_compute_loss`` on the batch, and grpo_objective's on the same batch with
    π_old as α (= π_k: TRL's clip is around 1 of π_θ/π_old, the kit's band around r′ = π_k/α = 1)."""
    batch = fixed_batch(off_policy)
    with torch.no_grad():
        current = logps(trainer, batch)
    inputs = {k: v for k, v in batch.items() if not k.startswith("_")}
    inputs["ref_per_token_logps"] = (current + batch["_ref_shift"]).clamp(max=0.0)   # log-probs: ≤ 0
    if off_policy:
        inputs["old_per_token_logps"] = (current + batch["_old_shift"]).clamp(max=0.0)
    trl_grad = gradient(trainer, trainer._compute_loss(trainer.model, inputs))

    logp = logps(trainer, batch)
    old = inputs.get("old_per_token_logps", logp.detach())
    weights = loss_weights(batch["completion_mask"].bool(), "dapo")
    loss, _ = grpo_objective(logp, old, batch["advantages"], weights, logp_k=old,
                             logp_ref=inputs["ref_per_token_logps"], beta=BETA, eps_low=trainer.args.epsilon,
                             eps_high=trainer.args.epsilon_high,
                             band="multiplicative", kl_kind="k3", **kit_options)
    return trl_grad, gradient(trainer, loss)


def test_the_trainer_runs_trls_defaults(trainer):
    """The defaults this file relies on: TRL 1.16's, not set by the test."""
    args = trainer.args
    assert args.use_bias_correction_kl is True and args.loss_type == "dapo"
    assert args.importance_sampling_level == "token" and not args.use_vllm and trainer.beta == BETA


@pytest.mark.parametrize("off_policy", [False, True])
def test_the_differentiable_kl_weight_gives_trls_gradient_and_the_detached_one_does_not(trainer, off_policy):
    """Same batch, same forward: ``kl_weight_differentiable=True`` is TRL's default gradient to float32 rounding;
    the detached weight (what the adapter mapped ``use_bias_correction_kl`` to before) is off by the KL term's
    difference, on-policy too (ρ = 1 in value)."""
    trl_grad, kit_grad = trl_and_kit_gradients(trainer, off_policy, kl_weight_differentiable=True)
    scale = float(trl_grad.norm())
    assert scale > 1e-3
    assert float((trl_grad - kit_grad).norm()) < 1e-5 * max(scale, 1.0), (float((trl_grad - kit_grad).norm()), scale)
    _, detached = trl_and_kit_gradients(trainer, off_policy, kl_importance_weighted=True)
    _, unweighted = trl_and_kit_gradients(trainer, off_policy)
    assert float((trl_grad - detached).norm()) > 1e-2 * scale
    assert float((trl_grad - unweighted).norm()) > 1e-2 * scale
    if not off_policy:  # ρ = 1: the detached weight changes nothing, so only the weight's gradient parts them
        assert float((detached - unweighted).norm()) < 1e-6 * max(scale, 1.0)


def test_trls_use_bias_correction_kl_maps_to_the_differentiable_weight():
    """The adapter's ``use_bias_correction_kl`` is ``kl_weight_differentiable``, not the detached
    ``kl_importance_weighted`` (which has no TRL field and keeps its own name)."""
    assert trl_values(GRPOConfig(kl_weight_differentiable=True))["use_bias_correction_kl"] is True
    assert trl_values(GRPOConfig(kl_importance_weighted=True))["use_bias_correction_kl"] is False
    assert trl_values(GRPOConfig(kl_importance_weighted=True))["kl_importance_weighted"] is True

    for lab in (GRPOConfig(kl_weight_differentiable=True), GRPOConfig(kl_importance_weighted=True)):
        back = validate_trl_values(SimpleNamespace(**trl_values(lab)))  # TRL names back to GRPOConfig's
        assert (back.kl_weight_differentiable, back.kl_importance_weighted) == (lab.kl_weight_differentiable,
                                                                              lab.kl_importance_weighted)
