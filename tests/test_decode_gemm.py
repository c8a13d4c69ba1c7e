"""grpo_lab.decode_gemm: the decoding kernel against torch's own linear, and the sampler that uses it."""

import platform
import sys

import pytest
import torch
from tiny_lm import PROMPTS, perturb, tiny_model, word_tokenizer

from grpo_lab import decode_gemm
from grpo_lab.policy import LMPolicy
from grpo_lab.sampling import HFSampler

F = torch.nn.functional


def test_the_kernel_builds_on_this_machine():
    """CI and the lab run on x86-64 Linux with a compiler: there the kernel must build (a silent
    fallback would pass every other test here while decoding at MKL's speed)."""
    assert sys.platform == "linux" and platform.machine() == "x86_64"
    assert decode_gemm.kernel() is not None


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
            got, want = decode_gemm.linear(x, w, bias), F.linear(x, w, bias)
            assert got.shape == want.shape == (rows, N)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * K**0.5)


def test_linear_keeps_the_leading_shape_and_reads_non_contiguous_inputs():
    x, w = torch.randn(16, 1, 40).transpose(0, 1), torch.randn(6, 40)        # [1, 16, 40], not contiguous
    with torch.no_grad():
        got = decode_gemm.linear(x, w)
    assert got.shape == (1, 16, 6)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_linear_is_torch_linear_outside_decoding():
    """More rows than DECODE_ROWS, float64, or a gradient to take: exactly F.linear (same bits)."""
    w = torch.randn(8, 32)
    many = torch.randn(decode_gemm.DECODE_ROWS + 1, 32)
    with torch.no_grad():
        assert torch.equal(decode_gemm.linear(many, w), F.linear(many, w))
        x64, w64 = torch.randn(4, 32, dtype=torch.float64), w.double()
        assert torch.equal(decode_gemm.linear(x64, w64), F.linear(x64, w64))
    x = torch.randn(4, 32, requires_grad=True)
    y = decode_gemm.linear(x, w)
    assert y.requires_grad and torch.equal(y, F.linear(x, w))


def test_sampler_decodes_through_the_kernel_with_the_same_tokens(monkeypatch):
    """fast_decode changes where the products run, not what is drawn: the same seed gives the same
    tokens as torch's linear, log α within float32 rounding, and log α = log π after a sync."""
    tokenizer = word_tokenizer()
    policy = LMPolicy(tiny_model(seed=2))
    perturb(policy)
    fast = HFSampler(policy, tokenizer, max_completion_length=10)
    plain = HFSampler(policy, tokenizer, max_completion_length=10, fast_decode=False)
    assert fast.fast_decode and not plain.fast_decode
    built, rows = decode_gemm.kernel(), []

    class Counting:  # the built kernel, recording the rows of each call
        def skinny_linear(self, x, w):
            rows.append(x.shape[0])
            return built.skinny_linear(x, w)

    monkeypatch.setattr(decode_gemm, "kernel", Counting)
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
