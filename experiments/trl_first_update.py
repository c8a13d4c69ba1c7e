"""TRL's first update against grpo_lab's on the same batch: why stock TRL collapsed.

Runs one step of the time-to-accuracy TRL arm (``trl.GRPOTrainer``, the CPU study's recipe), keeps the batch
it trained on (prompt and completion tokens, masks, TRL's advantages) and its rewards, then takes the loop's
step on that batch from the same θ0: log π_θ by :class:`~grpo_lab.lm.policy.LMPolicy`, the step plan of the
batch's rewards (:func:`~grpo_lab.plan.plan_step`: token weights, the empty-step decision, the loss's knobs),
the loss by :func:`~grpo_lab.objective.grpo_objective`, and the loop's optimiser
(:func:`~grpo_lab.loop.make_optimizer`) and clipping (:func:`~grpo_lab.loop.optimizer_step`). It prints both
gradient norms and how the two updates Δθ compare (cosine, largest coordinate difference). The advantages are
TRL's in both (TRL's whitening, not the paper's), so this checks the update, not the whitening::

    .venv/bin/python experiments/trl_first_update.py [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from typing import Any

import torch

from grpo_lab.lm.models import load_policy
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.recipes import recipe
from grpo_lab.lm.text_task import train_problems
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.loop import make_optimizer, optimizer_step
from grpo_lab.objective import grpo_objective
from grpo_lab.plan import StepPlan, plan_step
from grpo_lab.rollout import Rollout
from studies.time_to_accuracy.trl_side import trl_trainer


def trl_first_step(config: TrainConfig, model: Any, tokenizer: Any) -> tuple[dict[str, torch.Tensor], float]:
    """One ``GRPOTrainer`` step on ``model`` (trained in place); the batch it trained on (with its rewards
    ``[B]``, the one reward function's) and its grad norm."""
    import trl.trainer.grpo_trainer as grpo_trainer

    batch: dict[str, torch.Tensor] = {}
    # TRL shuffles a generation batch's rows before its step; no term of its loss depends on row order, and
    # unshuffled the rows stay prompt-major, lined up with the groups of the rewards the plan reads.
    shuffle, grpo_trainer.shuffle_sequence_dict = grpo_trainer.shuffle_sequence_dict, lambda rows: rows
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = trl_trainer(config, model, tokenizer, train_problems(config), output_dir)
        trainer.args.max_steps, trainer.args.logging_steps = 1, 1
        compute_loss, calculate_rewards = trainer.compute_loss, trainer._calculate_rewards

        def keeping_the_batch(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            batch.update({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})
            return compute_loss(model, inputs, *args, **kwargs)

        def keeping_the_rewards(*args: Any, **kwargs: Any) -> torch.Tensor:
            rewards_per_func = calculate_rewards(*args, **kwargs)
            batch["rewards"] = rewards_per_func[:, 0].detach().clone()
            return rewards_per_func

        trainer.compute_loss, trainer._calculate_rewards = keeping_the_batch, keeping_the_rewards
        try:
            trainer.train()
        finally:
            grpo_trainer.shuffle_sequence_dict = shuffle
    return batch, float(trainer.state.log_history[0]["grad_norm"])


def lab_step(config: TrainConfig, model: Any, batch: dict[str, torch.Tensor]) -> tuple[float, StepPlan]:
    """The loop's step on TRL's batch (v = 1: α = π_θ) with TRL's advantages; returns the gradient norm
    before clipping and the step plan."""
    mask = batch["completion_mask"].bool()
    rollout = Rollout(prompts=[None] * (mask.shape[0] // config.G), completions=batch["completion_ids"],
                      logp_alpha=torch.zeros(mask.shape), mask=mask,
                      extra={"prompt_ids": batch["prompt_ids"], "prompt_mask": batch["prompt_mask"]})
    plan = plan_step(batch["rewards"].view(-1, config.G), mask, config)
    model.requires_grad_(True)
    optimizer = make_optimizer(model.parameters(), config)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    logp = LMPolicy(model, temperature=config.temperature).logprobs(rollout, slice(None))
    loss, _ = grpo_objective(logp, logp.detach(), batch["advantages"], plan.weights, **plan.objective.kwargs())
    loss.backward()
    return optimizer_step(optimizer, params, config, model.named_parameters, "on TRL's batch"), plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # The earlier CPU study's TRL arm: SmolLM2-135M on sum3 (500 problems), strict scoring, lr 2e-5; one micro-batch
    base = recipe("cpu_arith_smollm2", task="sum3", scoring="strict", train_problems=500, lr=2e-5, empty_step="skip",
                  micro_batch_size=16, steps=60)
    config = base.replace(v=1, i=1, is_correction="ratio", seed=args.seed, checkpoint_every=0,
                          micro_batch_size=base.prompts_per_step * base.G)
    model, tokenizer = load_policy(config.model)
    theta0, lab = copy.deepcopy(model.state_dict()), copy.deepcopy(model)
    batch, trl_norm = trl_first_step(config, model, tokenizer)
    lab_norm, plan = lab_step(config, lab, batch)
    trl_delta = torch.cat([(p.detach() - theta0[n]).flatten().double() for n, p in model.named_parameters()])
    lab_delta = torch.cat([(p.detach() - theta0[n]).flatten().double() for n, p in lab.named_parameters()])
    cosine = float(trl_delta @ lab_delta / (trl_delta.norm() * lab_delta.norm()))
    rows, rewarded = batch["completion_mask"].shape[0], int((batch["advantages"] > 0).sum())
    print(f"seed {args.seed}: batch of {rows} completions, {rewarded} with A > 0, groups masked "
          f"{plan.masked_frac:.3f}, the loop's plan {'trains' if plan.trains else 'skips (no signal)'}; grad norm "
          f"TRL {trl_norm:.4f}, grpo_lab {lab_norm:.4f}; |Δθ| TRL {float(trl_delta.norm()):.4e}, grpo_lab "
          f"{float(lab_delta.norm()):.4e}; cosine {cosine:.6f}; largest coordinate difference "
          f"{float((trl_delta - lab_delta).abs().max()):.3e}")


if __name__ == "__main__":
    main()
