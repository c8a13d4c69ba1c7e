"""α in process: a frozen copy of π_θ's language model that samples G completions per prompt
(docs/theory.md §1, §5).

:class:`HFSampler` holds its own copy of the model — that copy *is* α. It
changes only at :meth:`HFSampler.sync`, an in-place copy of π_θ's weights, so
between syncs the sampler lags the trainer exactly as a separate inference
server would. The small functions before it (tokenising prompts, masking after
EOS, building the :class:`~grpo_lab.protocols.Rollout`) are what any sampler of
text needs, a vLLM one included.

Rollout layout (what :class:`~grpo_lab.lm.policy.LMPolicy` reads), B = P·G rows, row = p·G + g:

============================ =========== ==================================================
field                        shape       meaning
============================ =========== ==================================================
``prompts``                  P strings   the formatted prompts (chat template applied)
``extra["prompt_ids"]``      ``[B, Lp]`` prompt token ids, **left**-padded with the pad id
``extra["prompt_mask"]``     ``[B, Lp]`` 1 on real prompt tokens, 0 on left padding
``completions``              ``[B, T]``  sampled tokens, **right**-padded with the pad id
``mask``                     ``[B, T]``  True up to and including the first EOS
``logp_alpha``               ``[B, T]``  log α of each sampled token (0 where ``mask`` is False)
``extra["texts"]``           B strings   decoded completions (through EOS, special tokens dropped)
============================ =========== ==================================================

All tensors live on the CPU, next to the task's rewards; the policy moves the
rows it scores to its own device.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..checks import require_int_at_least, require_number_in, require_truncation
from ..fingerprint import prove_local, prove_pairs
from ..protocols import Rollout
from .decoding import Decoder, ModelDecoder
from .policy import LMPolicy, positions_from_mask


def tokenize_prompts(tokenizer: Any, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask ``[P, Lp]`` of already-formatted prompts, left-padded.

    No special tokens are added: the task's chat template already wrote them.
    """
    if len(prompts) == 0 or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts must be a non-empty sequence of strings, got {prompts!r}")
    encoded = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left",
                        add_special_tokens=False)
    if encoded["attention_mask"].sum(dim=1).min() == 0:
        raise ValueError("every prompt must have at least one token")
    return encoded["input_ids"], encoded["attention_mask"]


def completion_mask(completions: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """True on each row's tokens up to and including its first EOS, False after. ``[B, T]`` → ``[B, T]``."""
    is_eos = torch.isin(completions, torch.as_tensor(list(eos_token_ids), device=completions.device))
    eos_before = is_eos.long().cumsum(dim=1) - is_eos.long()
    return eos_before == 0


def build_rollout(prompts: Sequence[str], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  completions: torch.Tensor, logp_alpha: torch.Tensor, tokenizer: Any,
                  eos_token_ids: Sequence[int], pad_token_id: int) -> Rollout:
    """The :class:`Rollout` of the layout above from rows already repeated G times.

    Cuts each completion after its first EOS: tokens after it become the pad id,
    their log α 0 (finite), and the decoded text stops at it.
    """
    mask = completion_mask(completions, eos_token_ids)
    completions = completions.masked_fill(~mask, pad_token_id)
    logp_alpha = logp_alpha.masked_fill(~mask, 0.0)
    texts = tokenizer.batch_decode([row[keep].tolist() for row, keep in zip(completions, mask, strict=True)],
                                   skip_special_tokens=True)
    return Rollout(prompts=list(prompts), completions=completions, logp_alpha=logp_alpha, mask=mask,
                   extra={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "texts": texts})


def stop_and_pad_ids(model: Any, tokenizer: Any, eos_token_ids: Sequence[int] | None) -> tuple[list[int], int]:
    """The ids that end a completion (given, else the model's generation config, else the
    tokenizer's EOS) and the pad id (the tokenizer's, else the first EOS)."""
    if eos_token_ids is None:
        eos = model.generation_config.eos_token_id
        eos = tokenizer.eos_token_id if eos is None else eos
        eos_token_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if len(eos_token_ids) == 0:
        raise ValueError("eos_token_ids is empty and neither the model nor the tokenizer names an EOS token")
    eos_token_ids = [int(e) for e in eos_token_ids]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids[0]
    return eos_token_ids, pad


def sampler_temperature(policy: LMPolicy, temperature: float | None) -> float:
    """The sampler's T: the policy's (None: take it); any other value is refused, since log α and
    log π must be taken at one temperature for r′ = π_k/α to be a ratio of the same distributions."""
    if temperature is not None and temperature != policy.temperature:
        raise ValueError(f"temperature = {temperature!r} must equal the policy's ({policy.temperature}): "
                         "log α and log π are taken at one temperature")
    return require_number_in("temperature", policy.temperature, 0.0, low_open=True)


def draw_tokens(logp: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logp [b, V]`` (log-probabilities), drawn from exp(logp) by inverting its CDF.

    Equation: y = min{v : Σ_{u ≤ v} p_u > U · Σ_u p_u}, one U ~ Uniform[0, 1) per row from the global RNG.

    The same distribution as ``torch.multinomial(logp.exp(), 1)``, which spends an exponential variate
    per vocabulary entry where this spends one float64 cumulative sum per row (docs/benchmarks.md has
    the timings). A token of probability 0 is never drawn.
    """
    cdf = logp.exp().double().cumsum(-1)
    u = torch.rand(logp.shape[0], 1, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=logp.shape[-1] - 1)


def truncate_logprobs(logp: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """log α′: the log-probabilities ``logp [..., V]`` truncated to top-k, then top-p, and renormalised.

    Equation, per row (docs/theory.md §3, *Truncated sampling*)::

        S_k = {v : logp_v ≥ the k-th largest logp}                       (top_k = 0: all V tokens)
        q_v = exp(logp_v) / Σ_{u ∈ S_k} exp(logp_u)                       (renormalised on S_k)
        S   = {v ∈ S_k : Σ_{u ∈ S_k : q_u > q_v} q_u < top_p}            (top_p = 1: S = S_k)
        log α′_v = logp_v − log Σ_{u ∈ S} exp(logp_u) on S,   −inf off S

    ========= ============= ==========================================================
    argument  shape / range meaning
    ========= ============= ==========================================================
    ``logp``  ``[..., V]``  log-probabilities at temperature T (each row sums to 1)
    ``top_p`` (0, 1]        nucleus mass; 1 = off
    ``top_k`` int ≥ 0       tokens kept; 0 (or ≥ V) = off
    ========= ============= ==========================================================

    S is the fewest most probable tokens whose mass reaches top_p, so the most probable token is always
    kept. This is vLLM's and Hugging Face's cut (top-k first; then an ascending cumulative sum drops the
    tokens whose mass from below is ≤ 1 − top_p), with one difference: ties are decided by value. A
    token equal to the last kept one is kept, whatever order the sort gave the tie (those engines keep
    only the part of a tie that their sort put last; their top-k already keeps every token tied with the
    k-th). Both off, ``logp`` is returned as it is, with no work.
    """
    if not cuts(top_p, top_k, logp.shape[-1]):
        return logp
    window, ids = _kept_window(logp, top_p, top_k)
    return torch.full_like(logp, -math.inf).scatter_(-1, ids, window)


def cuts(top_p: float, top_k: int, vocabulary: int) -> bool:
    """Whether ``top_p`` / ``top_k`` truncate a distribution over ``vocabulary`` tokens (validated: top_p in
    (0, 1], top_k an int ≥ 0)."""
    require_truncation(top_p, top_k)
    return top_p < 1.0 or 0 < top_k < vocabulary


NUCLEUS_WIDTH = 64
"""Most probable tokens :func:`_kept_window` looks at first (top_k + 1 if more); it widens the look ×4 until
the kept set lies inside, so a decoding step orders only as many tokens as the cut needs, not the vocabulary."""


def _kept_window(logp: torch.Tensor, top_p: float, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log α′ ``[..., w]`` on each row's w most probable tokens (−inf on those cut) and their ids:
    the cut of :func:`truncate_logprobs`, computed where it lives. w grows until every row's kept set
    (top-k's too, ties included) lies strictly above the window's last value."""
    vocabulary = logp.shape[-1]
    by_k = 0 < top_k < vocabulary
    width = min(max(NUCLEUS_WIDTH, top_k + 1), vocabulary)
    # q is taken in float64 and renormalised over the whole row (or S_k): near top_p → 1 the cut's margin can be
    # ~1e-7, below float32 log_softmax's own error (a row of float32 log-probs summed to 1 + 3.5e-7 and put a
    # token whose exact mass above is 0.9989997 above 0.999).
    log_total = logp.double().logsumexp(-1, keepdim=True) if top_p < 1.0 and not by_k else None
    while True:
        values, ids = logp.topk(width, dim=-1)
        keep_k = values >= values[..., top_k - 1:top_k] if by_k else torch.ones_like(values, dtype=torch.bool)
        keep = keep_k
        if top_p < 1.0:
            exact = values.double()
            log_q = exact - (exact.masked_fill(~keep_k, -math.inf).logsumexp(-1, keepdim=True) if by_k else log_total)
            q = log_q.exp().masked_fill(~keep_k, 0.0)
            last = values.masked_fill(~(keep_k & (q.cumsum(-1) - q < top_p)), math.inf).amin(-1, keepdim=True)
            keep = keep_k & (values >= last)
        inside = keep_k if by_k else keep  # what the window must hold whole: S_k (its mass renormalises q), or S
        floor = values.masked_fill(~inside, math.inf).amin(-1, keepdim=True)
        if width == vocabulary or bool((values[..., -1:] < floor).all()):
            window = values.masked_fill(~keep, -math.inf)
            return window - window.logsumexp(-1, keepdim=True), ids
        width = min(4 * width, vocabulary)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                top_k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of α: a token per row of ``logits [b, V]`` drawn from α′ = softmax(logits / T) cut
    by ``top_k`` / ``top_p`` (:func:`truncate_logprobs`), and its log α′ ``[b]`` (float32). With a cut, the
    draw runs on the few most probable tokens that hold the kept set, not on the whole vocabulary."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if not cuts(top_p, top_k, logp.shape[-1]):
        token = draw_tokens(logp)
        return token, logp.gather(1, token[:, None]).squeeze(1)
    window, ids = _kept_window(logp, top_p, top_k)
    pick = draw_tokens(window)[:, None]
    return ids.gather(1, pick).squeeze(1), window.gather(1, pick).squeeze(1)


def draw_seed(generator: torch.Generator) -> int:
    """A seed for libraries that use the global RNG, drawn from the loop's generator."""
    return int(torch.randint(2**62, (1,), generator=generator))


class HFSampler:
    """The inference server in process: α is a frozen copy of the policy's model.

    ========================= =====================================================
    argument                  meaning
    ========================= =====================================================
    ``policy``                π_θ (:class:`LMPolicy`); deep-copied once: α's model,
                              scored as π_θ is (``score``, ``synced_logprobs``)
    ``tokenizer``             the model's tokenizer (needs a pad or an EOS token)
    ``max_completion_length`` T_max, tokens generated at most per completion
    ``temperature``           T; must equal ``policy.temperature`` (None: take it)
    ``eos_token_ids``         ids that end a completion; None: the model's
                              generation config, else the tokenizer's EOS
    ``top_p``, ``top_k``      truncation of each next-token distribution
                              (:func:`truncate_logprobs`); 1 and 0: off
    ========================= =====================================================

    Sampling is ancestral sampling at temperature T, truncated by ``top_k`` and
    ``top_p`` only if they are set here — never min-p, a repetition penalty or
    whatever the model's own generation config says. log α is the log-prob under
    the distribution actually sampled, α′ (truncated and renormalised). With a
    truncation on, α′ is not the distribution :meth:`LMPolicy.logprobs` scores
    (π_θ's full one), so r′ = π_k/α′ ≠ 1 even right after a sync: per token,
    log r′ = log α(S) ≤ 0, the log of the mass the cut kept (docs/theory.md §3).

    Decoding runs the model's own forward (:class:`~grpo_lab.lm.decoding.ModelDecoder`,
    any model, device and dtype; under the policy's autocast when it has one, so α
    computes in π_θ's compute dtype): α's layers are never patched and nothing is
    compiled for it (``benchmarks/decoding.py`` measured the alternatives; figures
    in docs/benchmarks.md).

    Each prompt is prefilled once; its keys and values are repeated for its G
    completions, which then decode one token per forward on a KV cache, with
    the attention mask and position ids ``generate`` would use. log α is the
    log-softmax of logits / T (float32), truncated, at the drawn token, taken
    from the distribution it was drawn from — no extra forward pass. Untruncated,
    it agrees with :meth:`LMPolicy.logprobs` of the same tokens right after a
    sync up to float rounding between the cached and the whole forward (in
    float32 within the 1e-4 tests/test_policy_sampling.py allows; in bfloat16,
    bf16 rounding).
    """

    def __init__(self, policy: LMPolicy, tokenizer: Any, max_completion_length: int,
                 temperature: float | None = None, eos_token_ids: Sequence[int] | None = None,
                 top_p: float = 1.0, top_k: int = 0) -> None:
        self.max_completion_length = require_int_at_least("max_completion_length", max_completion_length, 1)
        self.temperature = sampler_temperature(policy, temperature)
        self.top_p, self.top_k = require_truncation(top_p, top_k)
        self.eos_token_ids, self.pad_token_id = stop_and_pad_ids(policy.model, tokenizer, eos_token_ids)
        self.tokenizer = tokenizer
        self._scorer = copy.deepcopy(policy).eval().requires_grad_(False)  # α, scored as π_θ is (audit, π_sync)
        self.model = self._scorer.model
        self._names, self._targets = zip(*named_tensors(self.model), strict=True)
        self.decoder: Decoder = ModelDecoder(self.model)
        self._shapes = tuple(t.shape for t in self._targets)
        self._bytes = sum(t.numel() * t.element_size() for t in self._targets)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def sample(self, prompts: Sequence[str], group_size: int, generator: torch.Generator) -> Rollout:
        """G completions of each prompt from α with their log α (layout in the module docstring).

        Tokens are drawn from the global RNG under a seed drawn from ``generator``,
        inside ``torch.random.fork_rng``: the same generator state gives the same
        rollout, and the caller's global RNG is untouched.
        """
        require_int_at_least("group_size", group_size, 1)
        prompt_ids, prompt_mask = tokenize_prompts(self.tokenizer, prompts)
        device = self.device
        cuda_devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
        seed = draw_seed(generator)
        with torch.random.fork_rng(devices=cuda_devices):
            torch.manual_seed(seed)
            try:
                with self._scorer.autocast():                             # α computes as π_θ does
                    completions, logp_alpha = self._decode(prompt_ids.to(device), prompt_mask.to(device), group_size)
            finally:
                self.decoder.release()              # its KV cache is not held while π_θ trains on the batch
        return build_rollout(prompts, prompt_ids.repeat_interleave(group_size, dim=0),
                             prompt_mask.repeat_interleave(group_size, dim=0), completions.cpu(), logp_alpha.cpu(),
                             self.tokenizer, self.eos_token_ids, self.pad_token_id)

    def _decode(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``[P·G, T]`` and their log α: each prompt prefilled once, its cache repeated G
        times, then one token per forward until every row has ended (EOS) or T_max is reached.
        A row that has ended is fed the pad id, as ``generate`` does."""
        logits = self.decoder.prefill(prompt_ids, prompt_mask, positions_from_mask(prompt_mask),
                                      self.max_completion_length)
        self.decoder.repeat(group_size)
        logits = logits.repeat_interleave(group_size, dim=0)
        attention_mask = prompt_mask.repeat_interleave(group_size, dim=0)
        position = attention_mask.long().sum(1)                       # the next token's position id
        eos = torch.tensor(self.eos_token_ids, device=prompt_ids.device)
        ended = torch.zeros(logits.shape[0], dtype=torch.bool, device=prompt_ids.device)
        tokens, logps = [], []
        for t in range(self.max_completion_length):
            token, logp = sample_next(logits, self.temperature, self.top_p, self.top_k)
            token = token.masked_fill(ended, self.pad_token_id)  # its log α′ is masked to 0 by build_rollout
            tokens.append(token)
            logps.append(logp)
            ended = ended | torch.isin(token, eos)
            if t + 1 == self.max_completion_length or bool(ended.all()):
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=1)
            logits = self.decoder.step(token, position + t, attention_mask)
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)

    @torch.no_grad()
    def sync(self, policy: LMPolicy) -> int:
        """α ← π_θ: copy every parameter and buffer in place (storage kept); return the bytes moved.

        Tied weights (e.g. embeddings = LM head) are one tensor and copied once.
        One ``torch._foreach_copy_`` from π_θ's tensors into α's (listed once, at
        construction) keeps the cost at that of copying the bytes
        (``benchmarks/sync_copy.py``). π_θ's tensors are listed at every call, a
        small cost beside the copy, so a replaced weight is never missed.
        """
        names, sources = zip(*named_tensors(policy.model), strict=True)
        if names != self._names or tuple(t.shape for t in sources) != self._shapes:
            mismatch = sorted(set(names) ^ set(self._names))[:4] or "same names; order or shapes differ"
            raise ValueError(f"policy.model's parameters and buffers do not match the sampler's: {mismatch}")
        torch._foreach_copy_(self._targets, sources)
        return self._bytes

    @torch.no_grad()
    def prove_sync(self, policy: LMPolicy, step: int) -> None:
        """Prove that α serves π_θ's weights (:func:`grpo_lab.fingerprint.prove_local`; raises ``SyncError``): every
        tensor α's model reads — its parameters under every name (a tied LM head under its own) and its buffers —
        against π_θ's. Both models are walked afresh at every proof, so a weight replaced on either side is seen.
        Where their structures name the i-th tensors alike, the tensors are compared in pairs without their names
        (:func:`grpo_lab.fingerprint.prove_pairs`); anything that path cannot prove — a difference, a structure
        or a layout it does not read — goes to ``prove_local``, which proves it or names what differs."""
        served, served_keys = tensors_and_keys(self.model)
        held, held_keys = tensors_and_keys(policy.model)
        if served_keys != held_keys or not prove_pairs(served, held, step):
            sources = dict(named_tensors(policy.model, remove_duplicate=False))
            prove_local(named_tensors(self.model, remove_duplicate=False), sources, step)

    @torch.no_grad()
    def synced_logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log π_sync of ``rollout.completions[rows]`` ``[b, T]``: α's model (the last sync's weights) scored by a
        frozen copy of the policy, as it scores π_θ — a whole forward at T, untruncated; no extra memory."""
        return self._scorer.logprobs(rollout, rows)

    def score(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log α of ``rollout.completions[rows]`` for the sync audit: here α's model is the engine, so this is
        :meth:`synced_logprobs` (the decoder reads the same weights through a cached forward)."""
        return self.synced_logprobs(rollout, rows)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """α's weights (references, as ``nn.Module.state_dict``: save before the next sync)."""
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> Any:
        return self.model.load_state_dict(state)


class GenerateSampler(HFSampler):
    """α decoded as TRL's ``GRPOTrainer`` decodes without vLLM: transformers' ``model.generate`` on P·G rows, each
    prompt repeated G times and prefilled once per row (no prompt cache shared by a group), on generate's own
    growing KV cache, one token per forward until every row has ended or T_max is reached. The loop's
    ``sampler="hf_generate"``: a study's arm that isolates what TRL's way of decoding costs against
    :class:`HFSampler`'s (a shared prefill, a preallocated cache); everything but the decoding (sync, proofs,
    audit scoring, state) is :class:`HFSampler`'s.

    log α is what the loop needs for r′ = π_k/α: the log-prob of each drawn token under the distribution it was
    drawn from, α′ (:func:`truncate_logprobs` of logits / T). generate is told T = 1 and no top-k/top-p, so it
    adds no warper of its own, and is handed one logits processor, :class:`LogAlphaProcessor`, that turns each
    step's logits into log α′ and returns it as the scores generate samples from (softmax of log α′ is α′); at the
    next step it reads the token drawn and keeps its log α′. No extra forward, and no ``[B, T, V]`` scores held
    (what ``output_scores`` would keep). α's generation config is replaced by that one, so nothing the model's
    own config says (a top-k, a repetition penalty) reaches the draw.
    """

    def __init__(self, policy: LMPolicy, tokenizer: Any, max_completion_length: int,
                 temperature: float | None = None, eos_token_ids: Sequence[int] | None = None,
                 top_p: float = 1.0, top_k: int = 0) -> None:
        from transformers import GenerationConfig

        super().__init__(policy, tokenizer, max_completion_length, temperature, eos_token_ids, top_p, top_k)
        self.model.generation_config = GenerationConfig(
            max_new_tokens=self.max_completion_length, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            pad_token_id=self.pad_token_id, eos_token_id=list(self.eos_token_ids), disable_compile=True)

    def _decode(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``[P·G, T]`` and their log α from one ``generate`` call on the prompts repeated G times."""
        from transformers import LogitsProcessorList

        ids, mask = prompt_ids.repeat_interleave(group_size, dim=0), prompt_mask.repeat_interleave(group_size, dim=0)
        log_alpha = LogAlphaProcessor(self.temperature, self.top_p, self.top_k)
        sequences = self.model.generate(input_ids=ids, attention_mask=mask,
                                        generation_config=self.model.generation_config,
                                        logits_processor=LogitsProcessorList([log_alpha]))
        completions = sequences[:, ids.shape[1]:]
        return completions, log_alpha.finish(completions)


class LogAlphaProcessor:
    """A ``generate`` logits processor that makes each step's scores log α′ (logits / T, cut by ``top_p`` /
    ``top_k``, :func:`truncate_logprobs`) and keeps the log α′ of each token drawn from them (read at the next
    step, the last one by :meth:`finish`). Only one step's ``[B, V]`` log α′ is held at a time."""

    def __init__(self, temperature: float, top_p: float, top_k: int) -> None:
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.kept: list[torch.Tensor] = []
        self.last: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:                       # the previous step's token is the last column now
            self.kept.append(self.last.gather(1, input_ids[:, -1:]).squeeze(1))
        self.last = truncate_logprobs(torch.log_softmax(scores.float() / self.temperature, dim=-1),
                                      self.top_p, self.top_k)
        return self.last

    def finish(self, completions: torch.Tensor) -> torch.Tensor:
        """log α′ ``[B, T]`` of the tokens ``completions [B, T]`` generate returned (T steps were processed)."""
        if self.last is None or len(self.kept) + 1 != completions.shape[1]:
            raise ValueError(f"{len(self.kept) + (self.last is not None)} decoding steps were processed, "
                             f"the completions hold {completions.shape[1]} tokens")
        return torch.stack([*self.kept, self.last.gather(1, completions[:, -1:]).squeeze(1)], dim=1)


def named_tensors(model: torch.nn.Module, remove_duplicate: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Parameters then buffers (``named_parameters`` then ``named_buffers``, in their order), each shared tensor
    once (tied weights), or under each of its names; one walk over the modules instead of two, since every
    sync lists π_θ's (and a proof names both models' tensors when it must report one)."""
    parameters, buffers, seen = [], [], set()
    for prefix, module in model.named_modules(remove_duplicate=remove_duplicate):
        for found, members in ((parameters, module._parameters), (buffers, module._buffers)):
            for name, tensor in members.items():
                if tensor is None or (remove_duplicate and id(tensor) in seen):
                    continue
                seen.add(id(tensor))
                found.append((f"{prefix}.{name}" if prefix else name, tensor))
    return [*parameters, *buffers]


def tensors_and_keys(model: torch.nn.Module) -> tuple[list[torch.Tensor | None], list[tuple[str, ...] | None]]:
    """The tensors of ``named_tensors(model, remove_duplicate=False)`` in its order, without their names (a
    parameter or buffer set to None kept as None), and the keys that name them: each visited module's
    submodule, parameter and buffer keys, in walk order (None for a submodule set to None). Two models whose
    keys are equal and whose None entries sit at the same places name their i-th tensors alike, so a proof
    can pair them by position and build names only to report; the walk formats no names and hashes none."""
    parameters: list[torch.Tensor | None] = []
    buffers: list[torch.Tensor | None] = []
    keys: list[tuple[str, ...] | None] = []
    stack: list[torch.nn.Module | None] = [model]
    while stack:                                   # depth first, children in order: named_modules' walk
        module = stack.pop()
        if module is None:
            keys.append(None)
            continue
        children, own, held = module._modules, module._parameters, module._buffers
        keys += (tuple(children), tuple(own), tuple(held))
        parameters += own.values()
        buffers += held.values()
        stack += reversed(children.values())
    return [*parameters, *buffers], keys
