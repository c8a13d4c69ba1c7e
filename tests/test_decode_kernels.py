"""grpo_lab.lm.decoding.kernels: the decoding GEMM kernel against torch's linear, and the sampler on it.

The kernel is built on Linux x86-64 only; elsewhere these tests are skipped (the runtime uses F.linear
there, which ``test_linear_is_torch_linear_off_the_cpu`` and the sampler tests cover on any machine).
"""

import logging
import platform
import sys

import pytest
import torch
from tiny_lm import PROMPTS, perturb, tiny_model, word_tokenizer

from grpo_lab.lm.decoding import kernels as decode_kernels
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler

F = torch.nn.functional
BUILDS_HERE = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
builds_here = pytest.mark.skipif(not BUILDS_HERE, reason="the GEMM kernel is built on Linux x86-64 only")


@builds_here
def test_the_kernel_builds_on_this_machine():
    """On x86-64 Linux with a compiler (CI and the lab) the kernel must build: a silent fallback would
    pass every other test here while decoding at MKL's speed."""
    assert decode_kernels.kernel() is not None


@builds_here
def test_the_build_is_named_for_the_flags_and_the_cpu_and_announced(monkeypatch, caplog):
    """A binary built with -march=native on one CPU is not loaded on another: the name changes with the
    compiler flags and with /proc/cpuinfo's model and flags. A build not yet in the cache says so first."""
    name, seen = decode_kernels.build_name(), []
    monkeypatch.setattr(decode_kernels, "FLAGS", (*decode_kernels.FLAGS, "-mno-avx512f"))
    assert decode_kernels.build_name() != name
    monkeypatch.undo()
    for cpuinfo in ("model name\t: Another CPU\nflags\t: sse2 avx2\n", "model name\t: Another CPU\nflags\t: sse2\n"):
        monkeypatch.setattr(decode_kernels.Path, "read_text", lambda self, errors=None, text=cpuinfo: text)
        assert decode_kernels.build_name() not in (name, *seen)
        seen.append(decode_kernels.build_name())
    monkeypatch.undo()
    assert decode_kernels.built_before(decode_kernels.build_name()) == (decode_kernels.kernel() is not None)
    monkeypatch.setattr(decode_kernels, "built_before", lambda name: False)
    with caplog.at_level(logging.WARNING, logger=decode_kernels.__name__):
        assert decode_kernels.kernel.__wrapped__() is not None  # loads the cached build
    assert "compiling the decoding GEMM kernel" in caplog.text and name in caplog.text


def test_linear_is_torch_linear_off_the_cpu(monkeypatch):
    """Tensors off the CPU (here on the meta device, as a CUDA run's would be) never build the kernel."""
    monkeypatch.setattr(decode_kernels, "kernel", lambda: pytest.fail("built for a tensor off the CPU"))
    x, w = torch.empty(4, 32, device="meta"), torch.empty(8, 32, device="meta")
    with torch.no_grad():
        assert decode_kernels.linear(x, w).shape == (4, 8)


@builds_here
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


@builds_here
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


@builds_here
def test_sampler_decodes_through_the_kernel_with_the_same_tokens(monkeypatch):
    """The kernel changes where LeanDecoder's products run, not what is drawn: the same seed gives the
    same tokens as torch's linear, log α within float32 rounding, and log α = log π after a sync."""
    tokenizer = word_tokenizer()
    policy = LMPolicy(tiny_model(seed=2))
    perturb(policy)
    fast = HFSampler(policy, tokenizer, max_completion_length=10)
    plain = HFSampler(policy, tokenizer, max_completion_length=10)
    plain.decoder.linear = F.linear
    built, rows = decode_kernels.kernel(), []

    class Counting:  # the built kernel, recording the rows of each product
        def skinny_linear(self, x, w):
            rows.append(x.shape[0])
            return built.skinny_linear(x, w)

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
