"""TRL's colocate route on vLLM's CPU build with 2 processes: does it run, and if not, where does it stop?

Each rank builds :class:`grpo_lab.scale.trl.OffPolicyGRPOTrainer` with ``use_vllm=True``,
``vllm_mode="colocate"`` (one engine per rank, TRL's ``external_launcher``) on the bundled SmolLM2 and
trains ``--steps`` steps with ``vllm_sync_interval=--v``. A run that stops making progress for
``--stall`` seconds prints every thread's stack on every rank (``faulthandler``) and exits 3, so a hang
becomes a stack trace that says where::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \\
        .venv-vllm/bin/torchrun --nproc_per_node 2 tests/trl_vllm_two_process.py [--steps 2] [--sync-interval 2]
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import sys
import tempfile
import time

from transformers import TrainerCallback


class Watchdog(TrainerCallback):
    """Re-arms the stall timer at every step: only a step that takes longer than ``stall`` dumps the stacks."""

    def __init__(self, stall: float) -> None:
        self.stall = stall

    def on_step_end(self, args, state, control, **kwargs):
        faulthandler.dump_traceback_later(self.stall, exit=True)
        print(f"rank {os.environ.get('RANK')}: step {state.global_step} done at {time.strftime('%H:%M:%S')}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sync-interval", type=int, default=2, help="v")
    parser.add_argument("--stall", type=float, default=300.0,
                        help="seconds without progress before the stacks are dumped")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.stall, exit=True)  # covers the engines' construction too

    from datasets import Dataset

    from grpo_lab.lm.models import bundled_model_dir
    from grpo_lab.scale.trl import OffPolicyGRPOConfig, OffPolicyGRPOTrainer

    prompts = [f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n" for a, b in ((2, 3), (4, 1))]
    config = OffPolicyGRPOConfig(
        output_dir=tempfile.mkdtemp(), use_vllm=True, vllm_mode="colocate", vllm_sync_interval=args.sync_interval,
        vllm_enforce_eager=True, vllm_max_model_length=96, vllm_gpu_memory_utilization=0.3,
        per_device_train_batch_size=4, gradient_accumulation_steps=1, steps_per_generation=1, num_generations=4,
        max_completion_length=6, temperature=0.7, learning_rate=1e-4, max_steps=args.steps, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, bf16=False, disable_tqdm=True, seed=0)
    trainer = OffPolicyGRPOTrainer(model=str(bundled_model_dir()), reward_funcs=lambda completions, **_: [
        float(j % 2) for j in range(len(completions))], args=config, train_dataset=Dataset.from_dict(
        {"prompt": prompts * 8}), callbacks=[Watchdog(args.stall)])
    print(f"rank {os.environ.get('RANK')}: engine and trainer built at {time.strftime('%H:%M:%S')}", flush=True)
    trainer.train()
    faulthandler.cancel_dump_traceback_later()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(f"rank {os.environ.get('RANK')}: {args.steps} steps, syncs at {trainer.sync_steps}, losses {losses}",
          flush=True)
    expected = list(range(0, args.steps, args.sync_interval))
    sys.exit(0 if trainer.sync_steps == expected and all(map(math.isfinite, losses)) else 1)


if __name__ == "__main__":
    main()
