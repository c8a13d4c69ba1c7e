"""TRL's surface under the adapter: every member of TRL that :mod:`grpo_lab.scale.trl` overrides, calls,
reads or patches beyond TRL's documented API, with what the adapter relies on (:data:`SURFACE`).

``tests/test_trl_surface.py`` checks each row against the installed TRL and fails naming the member and
the version: the member exists, a method's signature has the parameters listed (an override's equals
TRL's), each ``evidence`` fragment is still in the TRL source named, and, where cheap, the behaviour
relied on. The rows were verified against TRL :data:`VERIFIED_TRL` (``pyproject.toml`` pins its series).

==================== ==============================================================================
kind                 meaning
==================== ==============================================================================
``override``         the adapter overrides this method; TRL must still call it (``evidence``)
``method``           the adapter calls it, or relies on what it does
``attribute``        an instance attribute (or property) the adapter reads
``global``           a module-level name the adapter patches
``field``            a ``trl.GRPOConfig`` field whose default ``OffPolicyGRPOConfig`` changes
==================== ==============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

VERIFIED_TRL = "1.16.0"
KINDS = ("override", "method", "attribute", "global", "field")

FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
"""Multimodal inputs of TRL's scoring forward (``_get_per_token_logps_and_entropies``), passed through."""


@dataclass(frozen=True)
class Touch:
    """One member of TRL the adapter relies on.

    ============ ==========================================================================================
    field        meaning
    ============ ==========================================================================================
    ``owner``    dotted path of the TRL class or module that holds it
    ``member``   its name there
    ``kind``     one of :data:`KINDS`
    ``relies``   what the adapter does with it and what it assumes
    ``params``   parameters the adapter passes (``method``) or receives (``override``)
    ``evidence`` (dotted path of a TRL function, code fragment its source must contain): the call or
                 assignment the adapter depends on
    ============ ==========================================================================================
    """

    owner: str
    member: str
    kind: str
    relies: str
    params: tuple[str, ...] = ()
    evidence: tuple[tuple[str, str], ...] = ()


_TRAINER = "trl.GRPOTrainer"
_GENERATION = "trl.generation.vllm_generation.VLLMGeneration"
_SCORE = f"{_TRAINER}._generate_and_score_completions"

SURFACE: tuple[Touch, ...] = (
    Touch(_TRAINER, "_last_loaded_step", "attribute",
          "a property reading global_step back and ignoring writes: TRL pushes π_θ to vLLM only where "
          "global_step != _last_loaded_step, so its per-step push never fires; only _generate syncs",
          evidence=((f"{_TRAINER}.__init__", "self._last_loaded_step = -1"),)),
    Touch(_TRAINER, "_generate", "override",
          "the entry of every generation (single turn, tools, rollout_func): sync α when due; without vLLM "
          "lend α as model_wrapped; TRL's tuple is returned unchanged",
          params=("prompts",), evidence=((_SCORE, "= self._generate(prompts)"),)),
    Touch(_TRAINER, "_generate_single_turn", "method",
          "without vLLM, generates with self.model_wrapped (which _generate points at α)",
          evidence=((f"{_TRAINER}._generate_single_turn", "self.model_wrapped"),)),
    Touch(_TRAINER, "_calculate_rewards", "override",
          "returns the rewards [N_all, F] of every function, gathered over processes (NaN where one "
          "abstains); the adapter keeps their weighted sum for the mask and the whitening",
          params=("inputs", "prompts", "completions", "completion_ids_list"),
          evidence=((_SCORE, "= self._calculate_rewards(inputs, prompts, completions, completion_ids_list)"),)),
    Touch(_TRAINER, "_generate_and_score_completions", "override",
          "TRL's batch dict (prompt_ids, prompt_mask, completion_ids, completion_mask; tool_mask, "
          "old_per_token_logps, ref_per_token_logps, sampling_per_token_logps when present), to which the "
          "adapter adds advantages, loss_mask, sampled_mask, loss_weights",
          params=("inputs",),
          evidence=((f"{_TRAINER}._prepare_inputs", "= self._generate_and_score_completions(generation_batch)"),
                    (_SCORE, 'output["sampling_per_token_logps"] = sampling_per_token_logps'))),
    Touch(_TRAINER, "_prepare_inputs", "method",
          "scores a generation batch once per steps_per_generation · num_iterations micro-steps and splits every "
          "tensor of it (the adapter's too) into steps_per_generation micro-batches for compute_loss; so with "
          "steps_per_generation = gradient_accumulation_steps, step k = global_step // num_iterations",
          params=("generation_batch",),
          evidence=((f"{_TRAINER}._prepare_inputs", "generate_every = self.args.steps_per_generation * "
                                                     "self.num_iterations"),
                    (f"{_TRAINER}._prepare_inputs", "split_tensor_dict(generation_batch, "
                                                     "self.args.steps_per_generation)"))),
    Touch(_TRAINER, "_compute_loss", "override", "the loss is grpo_objective; TRL's compute_loss returns it as is",
          params=("model", "inputs"), evidence=((f"{_TRAINER}.compute_loss", "return self._compute_loss(model, "
                                                                           "inputs)"),)),
    Touch(_TRAINER, "_get_per_token_logps_and_entropies", "method",
          "log π_θ with entropies, and log α of the in-process copy: (logps [B, T], entropies [B, T] or None, "
          "aux loss)", params=("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
                               "compute_entropy", *FORWARD_KEYS)),
    Touch(_TRAINER, "_metrics", "attribute",
          "{'train' | 'eval': defaultdict(list)}: the adapter appends off_policy/* values, TRL logs their means"),
    Touch(_TRAINER, "_logs", "attribute",
          "_logs['advantages'], a deque of the generation batch: the adapter's advantages replace TRL's in the "
          "completions table"),
    Touch(_TRAINER, "_dist", "attribute", "TRL's DistributedBackend: is_zero3, is_fsdp"),
    Touch("trl.distributed.DistributedBackend", "is_zero3", "attribute", "DeepSpeed ZeRO-3 is active"),
    Touch("trl.distributed.DistributedBackend", "is_fsdp", "attribute", "FSDP (any version) is active"),
    Touch(_TRAINER, "vllm_generation", "attribute", "TRL's VLLMGeneration when use_vllm"),
    Touch(_GENERATION, "_iter_named_params", "method",
          "yields (vLLM name, full tensor) of π_θ, gathering ZeRO-3/FSDP shards; every process must iterate"),
    Touch(_GENERATION, "sync_weights", "method", "pushes π_θ to vLLM (server or colocate, PEFT merged)"),
    Touch(_GENERATION, "llm", "attribute", "the colocated vllm.LLM the adapter loads weights into",
          evidence=((f"{_GENERATION}._init_vllm", "self.llm = LLM("),)),
    Touch(_GENERATION, "vllm_client", "attribute", "the server client (server mode)"),
    Touch("trl.generation.vllm_client.VLLMClient", "get_server_info", "method",
          "a dict whose ['model_config']['logprobs_mode'] is the server's --logprobs-mode",
          evidence=((f"{_TRAINER}.__init__", 'get_server_info()["model_config"]["logprobs_mode"]'),)),
    Touch("trl.generation.vllm_generation", "LLM", "global",
          "the vllm.LLM that VLLMGeneration._init_vllm calls by this module-level name, with no dtype and no "
          "enforce_eager: the adapter swaps it for one construction to add both"),
    Touch("trl.trainer.utils", "add_fused_lm_head", "method",
          "patches model.forward as an instance attribute (the copy α drops the deep-copied one first)",
          params=("model", "temperature", "cast_lm_head_to_fp32")),
    *(Touch(_TRAINER, name, "attribute", "read as set from the config") for name in (
        "use_vllm", "vllm_mode", "num_generations", "num_generations_eval", "num_iterations", "reward_weights",
        "temperature", "beta", "epsilon_low", "epsilon_high", "loss_type", "importance_sampling_level",
        "max_completion_length")),
    *(Touch("trl.GRPOConfig", name, "field", "OffPolicyGRPOConfig declares it again with another default")
      for name in ("loss_type", "use_bias_correction_kl", "ref_model_mixup_alpha", "disable_dropout",
                   "vllm_importance_sampling_correction")),
)
