"""P1: seconds per step of grpo_lab's loop vs TRL's GRPOTrainer, side by side in one run.

Same model (bundled SmolLM2-135M, float32, CPU), same problems (add1), G, prompts per
step, max completion tokens, β and i = 1; v = 1 for the loop (it syncs every step, the
cost TRL does not pay without vLLM). The two are run interleaved, one step each in
turn, so machine noise hits both alike; the ratio of medians is printed.

    .venv/bin/python benchmarks/trl_step_ratio.py [--steps 4] [--tokens 32] [--beta 0.04]

Target: ratio <= 0.75 (the loop at most 3/4 of TRL's step time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def lab_stepper(args: argparse.Namespace):
    from grpo_lab.build import build_loop
    from grpo_lab.train_config import TrainConfig

    config = TrainConfig(G=args.G, prompts_per_step=args.prompts, v=1, i=1, beta=args.beta, lr=1e-6,
                         temperature=1.0, max_completion_length=args.tokens, train_problems=200, steps=10**6)
    loop = build_loop(config)
    return loop.step


def trl_stepper(args: argparse.Namespace):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpo_lab.models import bundled_model_dir
    from grpo_lab.rewards import correctness_reward
    from grpo_lab.tasks import build_prompt, load_problems

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    problems = load_problems("add1", 200, seed=0)
    data = Dataset.from_dict({"prompt": [build_prompt(p, tokenizer) for p in problems],
                              "gold": [p.answer for p in problems]})

    def reward(completions, gold, **kwargs):
        return [correctness_reward(c, g) for c, g in zip(completions, gold)]

    config = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.G * args.prompts,
                        num_generations=args.G, max_completion_length=args.tokens, beta=args.beta,
                        learning_rate=1e-6, num_iterations=1, use_cpu=True, bf16=False, report_to="none",
                        save_strategy="no", logging_steps=1, disable_tqdm=True, max_steps=10**6, seed=0,
                        temperature=1.0)
    trainer = GRPOTrainer(model=str(bundled_model_dir()), reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tokenizer)
    trainer.create_optimizer_and_scheduler(num_training_steps=10**6)
    batches = iter(trainer.get_train_dataloader())
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which we step by hand

    def step():
        trainer.training_step(trainer.model, next(batches), None)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--G", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--beta", type=float, default=0.04)
    args = parser.parse_args()
    torch.manual_seed(0)
    steppers = {"grpo_lab": lab_stepper(args), "trl": trl_stepper(args)}
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for step in steppers.values():  # warm-up step each, not timed
        step()
    for _ in range(args.steps):
        for name, step in steppers.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:9s} s/step: " + " ".join(f"{x:6.2f}" for x in t) + f"   median {medians[name]:.2f}")
    ratio = medians["grpo_lab"] / medians["trl"]
    print(f"P1 ratio grpo_lab / trl = {ratio:.2f} (target <= 0.75) "
          f"[G={args.G}, P={args.prompts}, tokens={args.tokens}, beta={args.beta}, {torch.get_num_threads()} threads]")


if __name__ == "__main__":
    main()
