"""A tiny word-level tokenizer, random causal LMs and a task with reward variance in every group:
the shared fixtures of the sampler tests (HFSampler and VLLMSampler run the same checks on them)."""

import math
from collections.abc import Callable
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
)
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from grpo_lab import Rollout
from grpo_lab.lm.policy import LMPolicy

VOCAB = 128  # > 50, so HF's default top_k=50 would truncate and be caught
PAD, EOS = 0, 1
PROMPTS = ["w1 w2 w3", "w5", "w7 w8 w9 w10 w11 w12", "w20 w21"]


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Words ``w0``…``w124`` are ids 3…127; ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2."""
    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2, **{f"w{i}": i + 3 for i in range(VOCAB - 3)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_model(seed: int = 0, kind: str = "llama", layers: int = 2) -> torch.nn.Module:
    """Random Llama with tied embeddings and GQA (or a GPT-2, whose absolute
    positions show wrong position ids, invisible to RoPE); a large init range
    makes the next-token distributions sharp, so a shifted or truncated log-prob shows."""
    torch.manual_seed(seed)
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=2, n_positions=128,
                                          initializer_range=0.5, bos_token_id=EOS, eos_token_id=EOS,
                                          pad_token_id=PAD)).float()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.5, tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS,
                         bos_token_id=None)
    return LlamaForCausalLM(config).float()  # float32 whatever the default dtype (test_primitives sets float64)


def perturb(policy: LMPolicy, scale: float = 0.05, seed: int = 1) -> None:
    """Move every parameter of π_θ by seeded noise (π_θ ≠ α until the next sync)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


class EvenTokenTask:
    """Reward = fraction of even token ids in the completion: varies within every group."""

    def prompts(self, n: int, generator: torch.Generator) -> list[str]:
        return [PROMPTS[i] for i in torch.randint(len(PROMPTS), (n,), generator=generator)]

    def rewards(self, rollout: Rollout, generator: torch.Generator) -> torch.Tensor:
        even = ((rollout.completions % 2 == 0) & rollout.mask).sum(1) / rollout.mask.sum(1)
        return even.reshape(len(rollout.prompts), -1).double()


def check_state_dict_round_trip(sampler: Any, policy: LMPolicy, draw: Callable[[], Rollout],
                                move: Callable[[], None]) -> None:
    """α's ``state_dict`` saved, π_θ moved by ``move`` and synced into α (its rollout changes), the state
    loaded back: ``draw`` gives exactly the rollout it gave before (completions and log α)."""
    saved = {k: v.clone() for k, v in sampler.state_dict().items()}
    before = draw()
    move()
    sampler.sync(policy)
    assert not torch.equal(draw().logp_alpha, before.logp_alpha)
    sampler.load_state_dict(saved)
    restored = draw()
    assert torch.equal(restored.completions, before.completions)
    assert torch.equal(restored.logp_alpha, before.logp_alpha)


@torch.no_grad()
def truncated_scores(model: torch.nn.Module, rollout: Rollout, temperature: float, top_p: float = 1.0,
                     top_k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """log α′ of each sampled token, and log α(S), the log of the full distribution's mass on the kept set,
    ``[B, T]`` (0 off the mask), recomputed apart from the samplers: per row one whole forward of
    prompt + completion (no padding, no cache), logits / T cut by Hugging Face's top-k and top-p warpers."""
    warpers = LogitsProcessorList(([TopKLogitsWarper(top_k)] if top_k > 0 else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else []))
    log_alpha, log_kept = torch.zeros(rollout.mask.shape), torch.zeros(rollout.mask.shape)
    for b, (ids, keep, sampled) in enumerate(zip(rollout.extra["prompt_ids"], rollout.extra["prompt_mask"],
                                                 rollout.mask, strict=True)):
        prompt, n = ids[keep.bool()], int(sampled.sum())
        tokens = torch.cat([prompt, rollout.completions[b, :n]])[None]
        logits = model(input_ids=tokens).logits[0, len(prompt) - 1:-1].float() / temperature
        cut = warpers(tokens, logits)
        log_alpha[b, :n] = cut.log_softmax(-1).gather(1, tokens[0, len(prompt):, None]).squeeze(1)
        log_kept[b, :n] = logits.log_softmax(-1).masked_fill(cut.isinf(), -math.inf).logsumexp(-1)
    return log_alpha, log_kept


# Byte-level token strings: "Ġ" is a space, "Ċ" a newline, "Ù¨" the two bytes of "٨" (Arabic-Indic eight),
# "Â" a lone first byte of a two-byte character (a token that cannot be decoded alone).
BYTE_SPECIAL = ["<pad>", "<eos>", "<stop2>", "<sp>"]
BYTE_WORDS = [*"0123456789", "Ġ", "Ċ", ".", ",", "-", "/", "Ġ1", "1.", "ĠĠ", "Ġ.", "a", "Ġa", "Ù¨", "Â"]
BYTE_STOPS = [1, 2]
"""Two stop ids; ``<sp>`` is a special token that decoding drops."""
# Bytes of multi-byte spaces (GPT-2's alphabet: "Â" C2, "ł" A0, "ħ" 85, "ã" E3, "Ģ" 80, "¡" A1): U+00A0 = C2 A0
# and U+0085 = C2 85 split over two tokens, U+3000 = E3 80 80 split 1 + 2 and 2 + 1, merged with answer characters
# ("1Â" is "1" then C2, "ł1" A0 then "1"); C2 A1 is "¡", no space, and "Ģ" alone a lone continuation byte.
SPACE_BYTE_WORDS = ["ł", "ħ", "¡", "1Â", "ł1", "ã", "ãĢ", "Ģ", "ĢĢ", "ĢĢ1"]


def byte_tokenizer(extra_words: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer over :data:`BYTE_WORDS` (then ``extra_words``, e.g. :data:`SPACE_BYTE_WORDS`):
    digits, whitespace, punctuation, merged tokens (``" 1"``, ``"1."``), a two-byte digit, a lone byte, and
    special tokens (exact strict J's fixtures)."""
    vocab = {t: i for i, t in enumerate(BYTE_SPECIAL + BYTE_WORDS + (extra_words or []))}
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   additional_special_tokens=["<stop2>", "<sp>"])


def flat_model(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    """A random Llama with spread next-token distributions (so that accepted answers carry mass) and two
    logit ids past a ``vocab``-token tokenizer."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.08, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1)
    return LlamaForCausalLM(config).float().eval()
