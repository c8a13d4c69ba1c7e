"""grpo_lab.lm.decoding.decoder: the packed weight buffer, LeanDecoder against the model's forward, its sampler."""

import re
import sys
from pathlib import Path

import pytest
import torch
from tiny_lm import PAD, PROMPTS, VOCAB, perturb, word_tokenizer
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_lab.lm.decoding.decoder import LeanDecoder, pack_weights
from grpo_lab.lm.policy import LMPolicy, positions_from_mask
from grpo_lab.lm.sampling import HFSampler


def model_of(kind: str, seed: int = 0) -> torch.nn.Module:
    """Tiny random models of the families LeanDecoder supports, each with what sets it apart."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=96, intermediate_size=80, num_hidden_layers=2,
                  max_position_embeddings=128, initializer_range=0.3, pad_token_id=PAD)
    if kind == "llama, GQA, tied":
        model = LlamaForCausalLM(LlamaConfig(**common, num_attention_heads=6, num_key_value_heads=2,
                                             tie_word_embeddings=True))
    elif kind == "llama, MHA, biases, untied, rope scaling":
        model = LlamaForCausalLM(LlamaConfig(**common, num_attention_heads=6, num_key_value_heads=6,
                                             attention_bias=True, tie_word_embeddings=False,
                                             rope_scaling={"rope_type": "linear", "factor": 2.0}))
    elif kind == "qwen2":  # q, k, v biases; no o bias
        model = Qwen2ForCausalLM(Qwen2Config(**common, num_attention_heads=6, num_key_value_heads=3,
                                             tie_word_embeddings=True))
    else:
        raise ValueError(kind)
    with torch.no_grad():  # biases start at 0: give them values so that a dropped bias shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.2 * torch.randn(p.shape))
    return model.float().eval().requires_grad_(False)


def left_padded(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[row, width - n:] = 1
    return ids, mask


@pytest.mark.parametrize("kind", ["llama, GQA, tied", "llama, MHA, biases, untied, rope scaling", "qwen2"])
def test_lean_decoder_gives_the_model_forwards_logits(kind):
    """Prefill of left-padded prompts of different lengths, each prompt's cache repeated G times, then
    steps of one token per row: at every step the logits equal the model's forward over the whole
    sequence so far (float32 rounding, 1e-5 of the logits' scale)."""
    model = model_of(kind)
    reference = {name: t.clone() for name, t in model.state_dict().items()}
    decoder = LeanDecoder.from_model(model)
    assert all(torch.equal(model.state_dict()[name], t) for name, t in reference.items())  # packing moved, kept
    G, steps = 3, 6
    ids, mask = left_padded([5, 9, 2])
    logits = decoder.prefill(ids, mask, positions_from_mask(mask), steps)
    ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
    decoder.repeat(G)
    g = torch.Generator().manual_seed(2)
    for t in range(steps + 1):
        whole = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[:, -1]
        if t == 0:
            whole = whole[::G]  # the prefill's rows are the prompts
        scale = float(whole.abs().max())
        gap = float((logits - whole).abs().max())
        print(f"{kind}, step {t}: max |Δ logit| = {gap:.2e} (scale {scale:.1f})")
        assert gap <= 1e-5 * scale
        if t == steps:
            break
        token = torch.randint(1, VOCAB, (ids.shape[0],), generator=g)
        ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, mask.new_ones(ids.shape[0], 1)], 1)
        logits = decoder.step(token, mask.sum(1) - 1, mask)


@pytest.mark.parametrize("kind", ["llama, GQA, tied", "llama, MHA, biases, untied, rope scaling", "qwen2"])
def test_sampler_on_the_lean_decoder_draws_log_alpha_of_the_policy(kind):
    """HFSampler decoding with LeanDecoder (its default for these models): after a sync, log α of the
    drawn tokens is log π of LMPolicy's whole forward (1e-4, as for the model's own forward)."""
    policy = LMPolicy(model_of(kind).requires_grad_(True), temperature=0.8)
    sampler = HFSampler(policy, word_tokenizer(), max_completion_length=12)
    assert isinstance(sampler.decoder, LeanDecoder)
    perturb(policy)
    sampler.sync(policy)
    rollout = sampler.sample(PROMPTS, 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp = policy.logprobs(rollout, slice(None))
    gap = float((logp - rollout.logp_alpha)[rollout.mask].abs().max())
    print(f"{kind}: max |log α − log π| = {gap:.2e} over {int(rollout.mask.sum())} tokens")
    assert gap < 1e-4 and rollout.mask.sum() > 20


def test_lean_decoder_reads_the_weights_in_place():
    """The fused q/k/v and gate/up products are views of the model's weights: an in-place copy into
    the model (α's sync) changes what the decoder computes, with no rebuild."""
    model, other = model_of("qwen2", seed=0), model_of("qwen2", seed=5)
    decoder = LeanDecoder.from_model(model)
    with torch.no_grad():
        for target, source in zip(model.parameters(), other.parameters(), strict=True):
            target.copy_(source)
    ids, mask = left_padded([4, 7])
    logits = decoder.prefill(ids, mask, positions_from_mask(mask), 1)
    whole = other(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[:, -1]
    assert torch.allclose(logits, whole, atol=1e-5 * float(whole.abs().max()))


def test_supports_only_what_it_computes():
    assert LeanDecoder.supports(model_of("llama, GQA, tied")) and LeanDecoder.supports(model_of("qwen2"))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                           sliding_window=8, max_window_layers=0))
    mlp_bias = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=4, mlp_bias=True))
    gelu = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, hidden_act="gelu"))
    half = model_of("llama, GQA, tied").to(torch.bfloat16)
    for model in (gpt2, sliding, mlp_bias, gelu, half):
        assert not LeanDecoder.supports(model)
    reasons = [LeanDecoder.unsupported(model) for model in (gpt2, sliding, mlp_bias, gelu, half)]
    for reason, says in zip(reasons, ["model_type 'gpt2'", "full attention", "mlp_bias True", "'gelu'", "bfloat16"],
                            strict=True):
        assert says in reason, reason
    with pytest.raises(ValueError, match="GPT2LMHeadModel: model_type 'gpt2'"):
        LeanDecoder.from_model(gpt2)


def test_pack_weights_fuses_groups_and_keeps_values_on_huge_pages():
    """Values, shapes and dtypes kept; a group's view is its tensors concatenated along dim 0 and
    shares their memory; every tensor in one storage; where Linux offers transparent huge pages (not
    ``never``), the kernel reports the buffer backed by 2 MiB pages (/proc/self/smaps)."""
    q, k, single = torch.randn(2048, 1024), torch.randn(512, 1024), torch.randn(4096, 1024)
    groups = [[q, k], [torch.randn(3, 5).double()], [torch.arange(7)], [single]]
    before = [[t.clone() for t in group] for group in groups]
    views, huge = pack_weights(groups)
    for group, old, view in zip(groups, before, views, strict=True):
        assert all(torch.equal(t, b) and t.dtype == b.dtype for t, b in zip(group, old, strict=True))
        assert torch.equal(view, torch.cat(old))
    q.add_(1.0)
    assert torch.equal(views[0][:2048], q)  # the view reads the tensors' memory
    assert len({t.untyped_storage().data_ptr() for group in groups for t in group}) == 1
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if sys.platform == "linux" and thp.exists() and "[never]" not in thp.read_text():
        assert huge
        address = single.data_ptr()
        regions = re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text())
        region = next(r for r in regions
                      if int(r.split("-")[0], 16) <= address < int(r.split("-")[1].split()[0], 16))
        huge_kb = int(re.search(r"AnonHugePages:\s+(\d+) kB", region).group(1))
        print(f"AnonHugePages of the buffer: {huge_kb} kB")
        assert huge_kb >= 4096
    a, b = torch.randn(4, 4), torch.randn(2, 4)
    before = torch.cat([a, b])
    views, huge = pack_weights([[a, b]], huge_pages=False)  # plain memory: the same layout, no madvise
    assert not huge and torch.equal(views[0], before) and views[0].data_ptr() == a.data_ptr()


def test_pack_weights_refuses_a_group_it_cannot_fuse():
    with pytest.raises(ValueError, match=r"share their dtype and trailing shape.*\(4, 3\)"):
        pack_weights([[torch.randn(2, 4), torch.randn(4, 3)]])
    with pytest.raises(ValueError, match=r"share their dtype.*torch.float64"):
        pack_weights([[torch.randn(2, 4), torch.randn(2, 4).double()]])
