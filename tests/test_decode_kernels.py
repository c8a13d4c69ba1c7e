"""grpo_lab.lm.decoding.kernels: the decoding kernels against torch's linear and attention, and the sampler on them."""

import platform
import sys

import pytest
import torch
from tiny_lm import PROMPTS, perturb, tiny_model, word_tokenizer

from grpo_lab.lm.decoding import kernels as decode_kernels
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler

F = torch.nn.functional


def test_the_kernel_builds_on_this_machine():
    """CI and the lab run on x86-64 Linux with a compiler: there the kernel must build (a silent
    fallback would pass every other test here while decoding at MKL's speed)."""
    assert sys.platform == "linux" and platform.machine() == "x86_64"
    assert decode_kernels.kernel() is not None


@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 15, 16])
@pytest.mark.parametrize(("K", "N"), [(576, 192), (37, 7), (64, 5), (1536, 9), (16, 1)])
def test_linear_matches_torch(rows, K, N):
    """Every row count up to DECODE_ROWS (register blocks of 8 and each remainder), weight-row
    counts that are and are not multiples of 3, K with and without a tail past 16 lanes, with and
    without bias: the same products as F.linear up to float32 summation order."""
    g = torch.Generator().manual_seed(rows * 1000 + K + N)
    x, w, b = torch.randn(rows, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    with torch.no_grad():
        for bias in (None, b):
            got, want = decode_kernels.linear(x, w, bias), F.linear(x, w, bias)
            assert got.shape == want.shape == (rows, N)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * K**0.5)


def test_linear_keeps_the_leading_shape_and_reads_non_contiguous_inputs():
    x, w = torch.randn(16, 1, 40).transpose(0, 1), torch.randn(6, 40)        # [1, 16, 40], not contiguous
    with torch.no_grad():
        got = decode_kernels.linear(x, w)
    assert got.shape == (1, 16, 6)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_linear_is_torch_linear_outside_decoding():
    """More rows than DECODE_ROWS, float64, or a gradient to take: exactly F.linear (same bits)."""
    w = torch.randn(8, 32)
    many = torch.randn(decode_kernels.DECODE_ROWS + 1, 32)
    with torch.no_grad():
        assert torch.equal(decode_kernels.linear(many, w), F.linear(many, w))
        x64, w64 = torch.randn(4, 32, dtype=torch.float64), w.double()
        assert torch.equal(decode_kernels.linear(x64, w64), F.linear(x64, w64))
    x = torch.randn(4, 32, requires_grad=True)
    y = decode_kernels.linear(x, w)
    assert y.requires_grad and torch.equal(y, F.linear(x, w))


@pytest.mark.parametrize(("B", "H", "H_kv"), [(16, 9, 3), (3, 4, 4), (1, 6, 1)])
@pytest.mark.parametrize("D", [16, 64, 128])
@pytest.mark.parametrize(("S", "S_max"), [(1, 8), (16, 16), (17, 20), (77, 100), (40, 41)])
def test_attention_matches_sdpa(B, H, H_kv, D, S, S_max):
    """One query per row and head against S of the cache's S_max positions: grouped heads, head sizes
    up to 128, S below, at and past a multiple of 16 (the cache's spare rows read and dropped, or too
    few of them), keys masked out as left padding is: the same as scaled_dot_product_attention."""
    g = torch.Generator().manual_seed(B * 1000 + D * 10 + S)
    q = torch.randn(B, H, 1, D, generator=g)
    keys, values = (torch.randn(B, H_kv, S_max, D, generator=g) for _ in range(2))
    key_mask = torch.rand(B, S, generator=g) > 0.3
    key_mask[:, -1] = True  # each row's own newest token
    with torch.no_grad():
        got = decode_kernels.attention(q, keys, values, key_mask, scale=D**-0.5)
        want = decode_kernels.sdpa_attention(q, keys, values, key_mask, scale=D**-0.5)
    assert got.shape == want.shape == (B, H, 1, D)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_attention_gives_zeros_where_no_key_is_allowed_and_is_sdpa_outside_decoding():
    q, keys, values = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    key_mask = torch.ones(2, 8, dtype=torch.bool)
    key_mask[1] = False
    with torch.no_grad():
        got = decode_kernels.attention(q, keys, values, key_mask, scale=0.25)
    assert torch.equal(got[1], torch.zeros_like(got[1])) and got[0].abs().sum() > 0
    key_mask[1] = True
    cases = [(torch.randn(2, 4, 1, 20), torch.randn(2, 2, 8, 20), torch.randn(2, 2, 8, 20)),  # D not 16·C
             (q.double(), keys.double(), values.double()),                                    # float64
             (q.clone().requires_grad_(), keys, values)]                                      # a gradient wanted
    for args in cases:
        got = decode_kernels.attention(*args, key_mask, scale=0.25)
        assert torch.equal(got, decode_kernels.sdpa_attention(*args, key_mask, scale=0.25))
    assert cases[-1][0].requires_grad and got.requires_grad


def test_sampler_decodes_through_the_kernel_with_the_same_tokens(monkeypatch):
    """fast_decode changes where the products run, not what is drawn: the same seed gives the same
    tokens as torch's linear, log α within float32 rounding, and log α = log π after a sync."""
    tokenizer = word_tokenizer()
    policy = LMPolicy(tiny_model(seed=2))
    perturb(policy)
    fast = HFSampler(policy, tokenizer, max_completion_length=10)
    plain = HFSampler(policy, tokenizer, max_completion_length=10, fast_decode=False)
    assert fast.fast_decode and not plain.fast_decode
    built, rows = decode_kernels.kernel(), []

    class Counting:  # the built kernel, recording the rows of each product
        def skinny_linear(self, x, w):
            rows.append(x.shape[0])
            return built.skinny_linear(x, w)

        def decode_attention(self, *args):
            return built.decode_attention(*args)

    monkeypatch.setattr(decode_kernels, "kernel", Counting)
    a = fast.sample(PROMPTS, 4, torch.Generator().manual_seed(5))
    monkeypatch.undo()
    # decoding steps (P·G rows each), and the prefill's LM head (one position per prompt)
    assert set(rows) == {len(PROMPTS) * 4, len(PROMPTS)}, rows
    b = plain.sample(PROMPTS, 4, torch.Generator().manual_seed(5))
    assert torch.equal(a.completions, b.completions)
    torch.testing.assert_close(a.logp_alpha, b.logp_alpha, rtol=0, atol=1e-4)  # logits of ~±50 here
    with torch.no_grad():
        logp = policy.logprobs(a, slice(None))
    assert float((logp - a.logp_alpha)[a.mask].abs().max()) < 1e-4
