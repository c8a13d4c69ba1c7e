"""Run :class:`grpo_lab.scale.trl.OffPolicyGRPOTrainer` under ``accelerate launch`` and check it.

Two parts, on every process, results written as JSON by the main process:

1. ``fixed``: one fixed batch (deterministic completions of different lengths, two
   zero-variance groups and one group split between processes, log α, log π_k and
   log π_ref perturbed so that the clip bounds bite and the KL has a gradient). The
   adapter's loss and gradient (averaged over processes, as DDP does) are compared
   with :func:`grpo_lab.grpo_objective` on the whole batch in one process.
2. ``train``: a few real steps with lag v; which steps synced, lag, time and peak RSS.

Usage (the test runs the first line with a tiny model)::

    accelerate launch --config_file grpo_lab/configs/accelerate/cpu_2proc.yaml tests/trl_two_process.py \\
        --model-dir DIR --out result.json --steps 4 --v 2
    SMOL="$(python -c 'import grpo_lab.lm.models as m; print(m.bundled_model_dir())')"
    python tests/trl_two_process.py --model-dir "$SMOL" --out smol.json --parts train --steps 3 \\
        --max-new-tokens 32 --beta 0.04
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from datasets import Dataset
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

from grpo_lab import GRPOConfig, grpo_objective, plan_step, tv_terms
from grpo_lab.objective import RATIO_DIAGNOSTICS, ratio_diagnostics
from grpo_lab.scale.trl import OffPolicyGRPOConfig, OffPolicyGRPOTrainer

FIXED_PROMPTS = ("a b", "c d", "e f")  # rewards: all 1 (masked), mixed (split between 2 processes), all 0 (masked)
FIXED_G, FIXED_T = 4, 5
TRAIN_PROMPTS = ("a b c", "d e f", "g h i", "j k l", "m n a", "b d f")


def build_tiny_model(path: str | Path) -> str:
    """A random 2-layer Llama with a 16-word WordLevel tokenizer (pad 0, eos 1), saved to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>"] + [chr(ord("a") + i) for i in range(14)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="a"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>").save_pretrained(path)
    return str(path)


def fixed_completion(row: int) -> list[int]:
    """Completion of global row ``row``: 3 to FIXED_T tokens (lengths differ, so do the aggregations),
    no EOS, first token 2 + row."""
    return [2 + (row + 3 * t) % 14 for t in range(FIXED_T - row % 3)]


def fixed_reward(prompts: list[str], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """1 for prompt "a b", 0 for "e f"; "c d" (rows 4–7) gets 1 on rows 4, 5 and 0 on rows 6, 7: with
    2 processes each half of that group agrees, and only the gathered rewards show its variance."""
    return [1.0 if p == "a b" else 0.0 if p == "e f" else float(ids[0] < 8)
            for p, ids in zip(prompts, completion_ids, strict=True)]


def word_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """1 if the completion contains the word "a" (a coin flip for a random model)."""
    return [float("a" in c.split()) for c in completions]


def make_config(output_dir: str, num_processes: int, rows_per_step: int, **overrides: Any) -> OffPolicyGRPOConfig:
    """CPU config (float32: TRL's default bf16 autocast would blur the 1e-5 comparison) whose generation
    batch is ``rows_per_step`` rows over all processes, in 2 micro-batches per process when they divide
    evenly (to exercise exact micro-batching)."""
    local = rows_per_step // num_processes
    accumulation = 2 if local % 2 == 0 else 1
    values = dict(output_dir=output_dir, per_device_train_batch_size=local // accumulation,
                  gradient_accumulation_steps=accumulation, num_generations=FIXED_G, max_completion_length=8,
                  learning_rate=1e-2, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                  disable_tqdm=True, seed=0, bf16=False)
    values.update(overrides)
    return OffPolicyGRPOConfig(**values)


def run_fixed_batch(trainer: OffPolicyGRPOTrainer) -> dict[str, Any]:
    """The adapter's loss and gradient on the fixed batch, averaged over processes like DDP,
    and the same for grpo_objective on the gathered batch (every process computes it)."""
    acc, model = trainer.accelerator, trainer.model
    rows = [{"prompt": p} for p in FIXED_PROMPTS for _ in range(FIXED_G)]
    n = len(rows) // acc.num_processes
    first = acc.process_index * n

    def fake_generate(prompt_ids: list, *args: Any, **kwargs: Any) -> tuple[list[list[int]], None]:
        return [fixed_completion(first + j) for j in range(len(prompt_ids))], None

    trainer._generate_single_turn = fake_generate
    model.train()
    out = trainer._generate_and_score_completions(rows[first:first + n])
    generator = torch.Generator().manual_seed(1)
    noise_alpha, noise_k, noise_ref = 0.4 * torch.randn(3, len(rows), FIXED_T, generator=generator)[:, first:first + n]
    with torch.no_grad():
        logp_now = trainer._logps(model, out)
    T = logp_now.shape[1]
    # perturbed log-probs stay log-probs (≤ 0; padding holds 0): the loss refuses a positive one
    out["sampling_per_token_logps"] = (logp_now + noise_alpha[:, :T]).clamp(max=0.0)  # α ≠ π_θ
    out["old_per_token_logps"] = (logp_now + noise_k[:, :T]).clamp(max=0.0)  # π_k ≠ π_θ, ≠ α
    out["ref_per_token_logps"] = (logp_now + noise_ref[:, :T]).clamp(max=0.0)  # π_ref ≠ π_θ: the KL has a gradient
    batches = split_tensor_dict(shuffle_sequence_dict(out), trainer.args.gradient_accumulation_steps)
    model.zero_grad()
    for name in ("tv_estimate", *RATIO_DIAGNOSTICS):
        trainer._metrics["train"][f"off_policy/{name}"].clear()
    loss = sum(trainer.compute_loss(model, batch) for batch in batches)
    tv_logged = trainer._metrics["train"]["off_policy/tv_estimate"]  # one per equal-sized micro-batch
    expected = [ratio_diagnostics(*(acc.gather(acc.pad_across_processes(b[k], dim=1).contiguous()) for k in (
        "old_per_token_logps", "sampling_per_token_logps", "completion_mask")), trainer.args.is_correction,
        trainer.args.is_cap, trainer.args.is_floor, trainer.args.is_level or trainer.args.importance_sampling_level)
        for b in batches]
    diagnostics_error = max(abs(trainer._metrics["train"][f"off_policy/{name}"][j] - e[name])
                            for j, e in enumerate(expected) for name in RATIO_DIAGNOSTICS)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    loss = acc.reduce(loss.detach(), reduction="mean")
    grads = acc.reduce(grads, reduction="mean")

    everything = {k: acc.gather(acc.pad_across_processes(out[k], dim=1).contiguous()) for k in (
        "prompt_ids", "completion_ids", "completion_mask", "sampling_per_token_logps", "old_per_token_logps",
        "ref_per_token_logps") if k in out}
    lab_loss, lab_grads, metrics = lab_reference(trainer, everything)
    return {"loss": float(loss), "lab_loss": float(lab_loss),
            "loss_error": abs(float(loss) - float(lab_loss)),
            "grad_error": float((grads - lab_grads).abs().max()), "grad_scale": float(lab_grads.abs().max()),
            "tv_error": abs(sum(tv_logged) / len(tv_logged) - metrics["tv_estimate"]),
            "diagnostics_error": diagnostics_error, "ess_token": min(e["ess_token"] for e in expected),
            **{f"lab_{k}": v for k, v in metrics.items()}}


def lab_reference(trainer: OffPolicyGRPOTrainer, batch: dict[str, torch.Tensor]) -> tuple:
    """grpo_objective on the whole batch: log π_θ from a plain forward (not TRL's fused head),
    rewards recomputed from the prompts and completions, the step plan of one process
    (:func:`grpo_lab.plan_step`) with the adapter's knobs mapped to the lab's names by hand."""
    model, args = trainer.model, trainer.args
    prompts = [p for p in FIXED_PROMPTS for _ in range(FIXED_G)]
    rewards = torch.tensor(fixed_reward(prompts, batch["completion_ids"].tolist())).view(-1, FIXED_G)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    T = batch["completion_ids"].shape[1]
    model.zero_grad()
    logits = model(input_ids=input_ids).logits[:, -T - 1:-1] / args.temperature
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["completion_ids"][..., None]).squeeze(-1)
    config = GRPOConfig(G=FIXED_G, eps_std=args.eps_std, unbiased_std=args.unbiased_std,
                        eps_placement=args.eps_placement, mask_zero_variance=args.zero_variance_mask,
                        mask_normalize=args.mask_normalize, loss_type=args.loss_type,
                        max_completion_length=args.max_completion_length, beta=args.beta, empty_step=args.empty_step)
    plan = plan_step(rewards, batch["completion_mask"].bool(), config, dtype=logp.dtype)
    loss, metrics = grpo_objective(
        logp, batch["sampling_per_token_logps"], plan.advantages, plan.weights, logp_k=batch["old_per_token_logps"],
        logp_ref=batch.get("ref_per_token_logps"), beta=args.beta, eps_low=args.epsilon, eps_high=args.epsilon_high,
        band=args.clip_band, level=args.importance_sampling_level, is_correction=args.is_correction,
        kl_importance_weighted=args.kl_importance_weighted, kl_weight_differentiable=args.use_bias_correction_kl,
        is_cap=args.is_cap, is_floor=args.is_floor, is_level=args.is_level)
    metrics["masked_frac"] = plan.masked_frac
    metrics["tv_estimate"] = float(tv_terms(batch["old_per_token_logps"], batch["sampling_per_token_logps"],
                                            batch["completion_mask"]).mean())
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    return loss.detach(), grads, metrics


def run_training(model_dir: str, output_dir: str, steps: int, v: int, beta: float, max_new_tokens: int,
                 prompts_per_step: int, learning_rate: float) -> dict[str, Any]:
    """``steps`` real steps with lag v on TRAIN_PROMPTS; this process's sync steps, lags and timings."""
    num_processes = PartialState().num_processes
    config = make_config(output_dir, num_processes, prompts_per_step * FIXED_G, max_steps=steps,
                         vllm_sync_interval=v, beta=beta, max_completion_length=max_new_tokens,
                         learning_rate=learning_rate)
    dataset = Dataset.from_dict({"prompt": list(TRAIN_PROMPTS) * 4})
    trainer = OffPolicyGRPOTrainer(model=model_dir, reward_funcs=word_reward, args=config, train_dataset=dataset)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    keys = ("off_policy/lag", "off_policy/synced", "off_policy/sync_count", "off_policy/sync_seconds",
            "off_policy/ratio_k_max", "step_time")
    history = [{k: h[k] for k in keys if k in h} for h in trainer.state.log_history if "off_policy/lag" in h]
    return {"sync_steps": trainer.sync_steps, "history": history, "seconds": seconds,
            "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True, help="JSON file written by the main process")
    parser.add_argument("--parts", default="fixed,train", help="comma-separated: fixed, train")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--v", type=int, default=2)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--clip-band", default="additive")
    parser.add_argument("--learning-rate", type=float, default=1e-6, help="of the train part")
    args = parser.parse_args(argv)
    state = PartialState(cpu=True)  # before anything else: a GPU-less torchrun group is gloo only if asked
    result: dict[str, Any] = {"num_processes": state.num_processes}
    work = Path(args.out).parent / "trainer_out"  # save_strategy="no": nothing is saved there
    if "fixed" in args.parts:
        config = make_config(str(work), state.num_processes, len(FIXED_PROMPTS) * FIXED_G, beta=args.beta,
                             clip_band=args.clip_band, max_completion_length=FIXED_T)
        trainer = OffPolicyGRPOTrainer(model=args.model_dir, reward_funcs=fixed_reward, args=config,
                                       train_dataset=Dataset.from_dict({"prompt": list(FIXED_PROMPTS)}))
        result["fixed"] = run_fixed_batch(trainer)
    if "train" in args.parts:
        train = run_training(args.model_dir, str(work), args.steps, args.v, args.beta, args.max_new_tokens,
                             args.prompts_per_step, args.learning_rate)
        result["train"] = gather_object([train])
    if state.is_main_process:
        Path(args.out).write_text(json.dumps(result, indent=1))
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
