"""The lean decoder's products on a CPU: y = x·Wᵀ for a few rows x (a skinny GEMM), in C++.

Decoding feeds the model one token per row, so each linear layer multiplies P·G rows by a weight matrix
it reads whole: the step is bound by reading the weights, and MKL's GEMM reads them well below the
machine's memory bandwidth at so few rows. :func:`linear` keeps 8 rows × 2 weight rows of partial sums
in registers, reads each weight row from memory once (the second block of 8 rows finds it in cache),
prefetches the next weight rows, and splits the weight rows across torch's threads
(``benchmarks/decoding.py`` measures it against ``F.linear``; docs/benchmarks.md has the figures).

It is compiled on first use with the machine's C++ compiler (``torch.utils.cpp_extension``, about a
minute, then cached under a name that holds the compiler flags and the CPU, so a binary built with
``-march=native`` on one CPU is never loaded on another). It is built and run only for float32 CPU
tensors on Linux x86-64 without a gradient; everywhere else, and where the build fails, :func:`linear`
is ``torch.nn.functional.linear``.

============ ============ ===============================================
symbol       shape        meaning
============ ============ ===============================================
x            ``[..., K]`` the inputs; M = their rows (x.numel() / K)
W            ``[N, K]``   an ``nn.Linear`` weight (contiguous, float32)
b            ``[N]``      its bias, or None
returned     ``[..., N]`` x·Wᵀ + b, summed in float32 in another order
                          than MKL's (equal up to float32 rounding)
============ ============ ===============================================
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

FLAGS = ("-O3", "-march=native", "-fopenmp")
LOG = logging.getLogger(__name__)

DECODE_ROWS = 16
"""The most rows M for which the kernel runs (P·G decoding rows); more rows (a prefill, larger groups) go to
MKL's blocked GEMM, which reads each weight once for many rows (docs/benchmarks.md, the decoding row)."""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>

typedef float vec __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register or two AVX2 ones
typedef int ivec __attribute__((vector_size(64)));
constexpr int64_t L = 16, MB = 8, NB = 2;             // lanes; rows of x and of W per register block

static inline vec load(const float* p) { vec v; __builtin_memcpy(&v, p, sizeof(vec)); return v; }

// The lanes that fold each 2h-wide group of a pair of vectors to h wide (h = 8, 4, 2, 1).
static inline ivec fold_lanes(int h, int high) {
  ivec m;
  for (int p = 0; p < L; ++p) m[p] = (p < 8 ? 0 : L) + (p % 8) / h * 2 * h + (p % 8) % h + high * h;
  return m;
}

// r[i] = the sum of a[i]'s lanes, for 16 vectors: 15 vector adds instead of 16 horizontal sums.
static inline vec sum_lanes16(vec* a) {
  for (int h = 8, count = L; h >= 1; h /= 2, count /= 2) {
    const ivec lo = fold_lanes(h, 0), hi = fold_lanes(h, 1);
    for (int j = 0; j < count / 2; ++j)
      a[j] = __builtin_shuffle(a[2 * j], a[2 * j + 1], lo) + __builtin_shuffle(a[2 * j], a[2 * j + 1], hi);
  }
  return a[0];
}

// y[m0 + i, n0 + j] = x[m0 + i, :] · w[n0 + j, :] for i < mb, j < nb
template <int mb, int nb>
static void block(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t n0) {
  vec acc[mb][nb] = {};
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    vec wv[nb], xv[mb];
    for (int j = 0; j < nb; ++j) wv[j] = load(w + (n0 + j) * K + k);
    for (int j = 0; j < nb && n0 + nb + j < N; ++j) __builtin_prefetch(w + (n0 + nb + j) * K + k, 0, 3);
    for (int i = 0; i < mb; ++i) xv[i] = load(x + (m0 + i) * K + k);
    for (int i = 0; i < mb; ++i)
      for (int j = 0; j < nb; ++j) acc[i][j] += xv[i] * wv[j];
  }
  if constexpr (mb * nb == L) {
    if (k == K) {
      const vec r = sum_lanes16(&acc[0][0]);
      for (int i = 0; i < mb; ++i)
        for (int j = 0; j < nb; ++j) y[(m0 + i) * N + n0 + j] = r[i * nb + j];
      return;
    }
  }
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) {
      float s = 0.f;
      for (int l = 0; l < L; ++l) s += acc[i][j][l];
      for (int64_t kk = k; kk < K; ++kk) s += x[(m0 + i) * K + kk] * w[(n0 + j) * K + kk];
      y[(m0 + i) * N + n0 + j] = s;
    }
}

template <int nb>
static void rows(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m0 = 0;
  for (; m0 + MB <= M; m0 += MB) block<MB, nb>(x, w, y, K, N, m0, n0);
  switch (M - m0) {
    case 7: block<7, nb>(x, w, y, K, N, m0, n0); break;
    case 6: block<6, nb>(x, w, y, K, N, m0, n0); break;
    case 5: block<5, nb>(x, w, y, K, N, m0, n0); break;
    case 4: block<4, nb>(x, w, y, K, N, m0, n0); break;
    case 3: block<3, nb>(x, w, y, K, N, m0, n0); break;
    case 2: block<2, nb>(x, w, y, K, N, m0, n0); break;
    case 1: block<1, nb>(x, w, y, K, N, m0, n0); break;
  }
}

torch::Tensor skinny_linear(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and W [N, K]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat, "float32 only");
  TORCH_CHECK(w.is_contiguous(), "W must be contiguous");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (N + NB - 1) / NB, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB;
      if (n0 + NB <= N) rows<NB>(xp, wp, yp, M, K, N, n0);
      else for (int64_t n = n0; n < N; ++n) rows<1>(xp, wp, yp, M, K, N, n);
    }
  });
  return y;
}
"""


def build_name() -> str:
    """The extension's name: the torch version, and a hash of the compiler flags and of this CPU's model
    and instruction-set flags (``/proc/cpuinfo``), since ``-march=native`` builds for this CPU alone."""
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    cpu = next((line for line in cpuinfo if line.startswith("model name")), ""), next(
        (line for line in cpuinfo if line.startswith("flags")), "")
    digest = hashlib.sha256("\n".join([*FLAGS, *cpu]).encode()).hexdigest()[:12]
    version = torch.__version__.replace(".", "_").replace("+", "_")
    return f"grpo_lab_decode_gemm_{version}_{digest}"


def built_before(name: str) -> bool:
    """Whether torch's extension folder (``TORCH_EXTENSIONS_DIR``, else its default) holds a build of ``name``."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    return any(root.glob(f"*/{name}/{name}.so"))


@functools.cache
def kernel() -> Any:
    """The compiled extension (built once per machine, torch version and source), or None where it
    cannot be built here (not Linux on x86-64, no compiler, a build error), with a warning saying why.
    Called only for float32 CPU tensors (:func:`built_for`), so a CUDA run never builds it."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        if shutil.which("ninja") is None:  # the `ninja` package's binary, when its venv is not on PATH
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        name = build_name()
        if not built_before(name):
            LOG.warning("grpo_lab.lm.decoding.kernels: compiling the decoding GEMM kernel %s for this CPU "
                        "(about a minute, once; later runs load it)", name)
        return load_inline(name, cpp_sources=SOURCE, functions=["skinny_linear"], extra_cflags=list(FLAGS),
                           extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # no compiler or ninja, a failed build: the decoder keeps torch's own
        warnings.warn(f"grpo_lab.lm.decoding.kernels: the decoding GEMM kernel could not be built "
                      f"({type(exc).__name__}: {str(exc)[:300]}); decoding uses torch's F.linear", stacklevel=2)
        return None


def built_for(*tensors: torch.Tensor) -> Any:
    """:func:`kernel` where it may run on ``tensors``: all float32 on the CPU and no gradient wanted
    through them (the kernel has no backward); else None, without building it."""
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return kernel()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through the kernel when x has at most :data:`DECODE_ROWS` rows,
    everything is float32 on the CPU, no gradient is wanted and the kernel is built."""
    rows = x.numel() // max(x.shape[-1], 1)
    built = built_for(x, weight) if rows <= DECODE_ROWS and weight.is_contiguous() else None
    if built is None:
        return F.linear(x, weight, bias)
    y = built.skinny_linear(x.reshape(rows, x.shape[-1]), weight)
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], weight.shape[0])
