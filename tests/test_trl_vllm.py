"""grpo_lab.scale.trl's colocate route on the real engine (``make test-vllm``): OffPolicyGRPOTrainer with
``use_vllm=True, vllm_mode="colocate"`` trains the bundled SmolLM2 on the CPU, pushing π_θ into vLLM every
v steps, and r′ = π_k/α uses the log-probs the engine returned for the lagged α."""

import copy
import gc
import math

import pytest
import torch
from datasets import Dataset

from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.scale.trl import OffPolicyGRPOConfig, OffPolicyGRPOTrainer
from grpo_lab.sync_audit import SyncError

pytestmark = pytest.mark.vllm

STEPS, V, G = 3, 2, 4
PROMPTS = [f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n" for a, b in ((2, 3), (4, 1))]


def alternating_reward(completions, **kwargs):
    """Half of every group right: every step learns, so π_θ moves away from the lagged α."""
    return [float(j % 2) for j in range(len(completions))]


def test_colocate_pushes_every_v_steps_and_r_prime_uses_the_lagged_alpha(tmp_path):
    config = OffPolicyGRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_mode="colocate", vllm_sync_interval=V,
        vllm_enforce_eager=True, vllm_max_model_length=96, vllm_gpu_memory_utilization=0.3,
        per_device_train_batch_size=G, gradient_accumulation_steps=1, steps_per_generation=1, num_generations=G,
        max_completion_length=6, temperature=0.7, learning_rate=1e-4, max_steps=STEPS, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, bf16=False, disable_tqdm=True, seed=0)
    trainer = OffPolicyGRPOTrainer(model=str(bundled_model_dir()), reward_funcs=alternating_reward, args=config,
                                   train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}))
    llm = trainer.vllm_generation.llm
    pushes, rpc = [], llm.collective_rpc

    def counted(method, *args, **kwargs):
        pushes.append(method)
        return rpc(method, *args, **kwargs)

    llm.collective_rpc = counted
    synced_weights, seen, sync, compute_loss = [], [], trainer._sync_sampler, trainer._compute_loss

    def sync_and_remember():
        sync()
        synced_weights.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})

    def loss_and_remember(model, inputs):
        seen.append((synced_weights[-1], {k: v.detach().clone() if torch.is_tensor(v) else v
                                          for k, v in inputs.items()}))
        return compute_loss(model, inputs)

    trainer._sync_sampler, trainer._compute_loss = sync_and_remember, loss_and_remember
    try:
        trainer.train()
        assert pushes.count("reload_weights") == math.ceil(STEPS / V) == len(trainer.sync_steps)
        assert trainer.sync_steps == [0, 2]
        logs = [h for h in trainer.state.log_history if "off_policy/lag" in h]
        assert [h["off_policy/lag"] for h in logs] == [0, 1, 0]
        assert all(math.isfinite(h["loss"]) for h in logs)
        alpha = copy.deepcopy(trainer.model)
        for step, (weights, inputs) in enumerate(seen):
            alpha.load_state_dict(weights)
            with torch.no_grad():
                logp_synced = trainer._logps(alpha, inputs)
            mask = inputs["completion_mask"].bool()
            engine = inputs["sampling_per_token_logps"]
            gap = float((engine - logp_synced)[mask].abs().max())
            print(f"step {step}: max |log α (engine) − log π(weights at the last sync)| = {gap:.2e}")
            assert gap < 2e-3  # the engine sampled from the weights of the last sync
        lagged = [h["off_policy/log_ratio_k_abs"] for h in logs]
        print(f"mean |log π_k − log α| per step: {lagged}")
        assert lagged[1] > 10 * max(lagged[0], lagged[2])  # step 1 ran on α = π_0 ≠ π_1
        # The sync audit asked the engine at step 2's sync and passed; π_θ trained since, and a sync that pushes
        # nothing is caught (the engine still serves step 2's weights); a real push passes.
        assert trainer._audit.reference[2] == 2
        with pytest.raises(SyncError, match="step 3 did not take"):
            trainer._audit_sync(3)
        sync()
        trainer._audit_sync(3)
        assert trainer._audit.reference[2] == 3
    finally:
        trainer = llm = None  # noqa: F841
        gc.collect()  # vLLM holds one set of process groups: free them before the next engine
