"""The decoding step's kernels on a CPU: y = x·Wᵀ for a few rows x, and attention of one query per row.

**Products.** Decoding feeds the model one token per row, so each linear layer multiplies P·G rows (16 in the
P1 benchmark) by a weight matrix it reads whole. MKL's float32 GEMM runs those skinny products at
~11 GB/s of weights here (51 ms per SmolLM2 step at 16 rows) where a plain read streams 26 GB/s.
The kernel below keeps 8 rows × 2 weight rows of partial sums in registers, reads each weight row
from memory once (the second block of 8 rows finds it in cache), prefetches the next weight rows,
and splits the weight rows across torch's threads: 39 ms for the same step, 28 ms at 8 rows
against MKL's 50 (``benchmarks/decode_gemm.py``).

**Attention.** A decoding step attends one query per row and head to the few hundred cached keys at
most: ~2.8 MFLOP for SmolLM2's 30 blocks at 16 rows. :func:`attention` makes one pass per (row,
head): scores of 16 keys at a time, softmax, weighted values, with q and the output in registers.
Timed inside SmolLM2 decoding steps of 16 rows (each block's keys and values cold in cache after the
products stream the weights): 130 µs a block against ``scaled_dot_product_attention``'s 165, i.e.
3.9 against 4.9 ms a step.

Both are compiled on first use with the machine's C++ compiler (``torch.utils.cpp_extension``,
~45 s, then cached); where that fails, or for other dtypes, devices and shapes, :func:`linear` is
``torch.nn.functional.linear`` and :func:`attention` is ``scaled_dot_product_attention``.

============ ============ ===============================================
symbol       shape        meaning
============ ============ ===============================================
x            ``[..., K]`` the inputs; M = their rows (x.numel() / K)
W            ``[N, K]``   an ``nn.Linear`` weight (contiguous, float32)
b            ``[N]``      its bias, or None
returned     ``[..., N]`` x·Wᵀ + b, summed in float32 in another order
                          than MKL's (relative gap ~1e-6)
============ ============ ===============================================

Attention (GQA: query head h reads key/value head h // (H / H_kv), as ``repeat_kv`` does):

============ ======================== ============================================
symbol       shape                    meaning
============ ======================== ============================================
q            ``[B, H, 1, D]``         one query per row and head
K, V         ``[B, H_kv, S_max, D]``  the cache; the first S positions are read
key_mask     ``[B, S]``               True on the keys a row attends to
returned     ``[B, H, 1, D]``         softmax(scale · q·Kᵀ over allowed keys) · V
============ ======================== ============================================
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
import types
import warnings
from typing import Any

import torch
import torch.nn.functional as F

DECODE_ROWS = 16
"""The most rows M for which the kernel runs: 0.65x MKL's time at 8 rows, 0.82x at 16; at 24 and 32 the
kernel measured no faster (``benchmarks/decode_gemm.py``), so F.linear runs there."""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

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

// e^x for x <= 0 (scores minus their maximum): 2^n · p(r), Cephes' expf polynomial; relative error ~2e-7
static inline vec exp_nonpositive(vec x) {
  x = x < -87.f ? -87.f : x;
  const vec t = x * 1.44269504088896341f + 0.5f;
  ivec n = __builtin_convertvector(t, ivec);
  n += (t < __builtin_convertvector(n, vec)) ? -1 : 0;  // floor, not truncation
  const vec fn = __builtin_convertvector(n, vec);
  const vec r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
  vec y = 1.9875691500e-4f * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.f;
  const ivec bits = (n + 127) << 23;
  vec scale;
  __builtin_memcpy(&scale, &bits, sizeof(vec));
  return y * scale;
}

// One (row, head): p = softmax over allowed keys of scale · q·k_s, out = Σ_s p_s v_s; D = 16·C, q and the
// output held in C registers each.
template <int C>
static void attend(const float* q, const float* k, const float* v, const bool* allowed, int64_t S, int64_t ss,
                   float scale, float* p, float* out) {
  vec qv[C];
  for (int c = 0; c < C; ++c) qv[c] = load(q + c * L);
  int64_t s = 0;
  for (; s + L <= S; s += L) {  // 16 keys: a vector of partial sums each, folded together
    vec acc[L];
    for (int j = 0; j < L; ++j) {
      acc[j] = qv[0] * load(k + (s + j) * ss);
      for (int c = 1; c < C; ++c) acc[j] += qv[c] * load(k + (s + j) * ss + c * L);
    }
    const vec r = sum_lanes16(acc) * scale;
    __builtin_memcpy(p + s, &r, sizeof(vec));
  }
  for (; s < S; ++s) {
    vec lanes = qv[0] * load(k + s * ss);
    for (int c = 1; c < C; ++c) lanes += qv[c] * load(k + s * ss + c * L);
    float dot = 0.f;
    for (int l = 0; l < L; ++l) dot += lanes[l];
    p[s] = dot * scale;
  }
  float top = -INFINITY;
  for (int64_t t = 0; t < S; ++t) top = allowed[t] ? std::max(top, p[t]) : top;
  if (top == -INFINITY) return;  // no key allowed: zeros
  vec sums = {};
  for (s = 0; s + L <= S; s += L) {
    vec e = exp_nonpositive(load(p + s) - top);
    for (int l = 0; l < L; ++l) e[l] = allowed[s + l] ? e[l] : 0.f;
    sums += e;
    __builtin_memcpy(p + s, &e, sizeof(vec));
  }
  float total = 0.f;
  for (int l = 0; l < L; ++l) total += sums[l];
  for (; s < S; ++s) total += (p[s] = allowed[s] ? std::exp(p[s] - top) : 0.f);
  vec o[C] = {};
  for (int64_t t = 0; t < S; ++t)
    for (int c = 0; c < C; ++c) o[c] += load(v + t * ss + c * L) * p[t];
  for (int c = 0; c < C; ++c) {
    const vec r = o[c] * (1.f / total);
    __builtin_memcpy(out + c * L, &r, sizeof(vec));
  }
}

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor key_mask,
                               double scale) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 1 && k.dim() == 4 && v.sizes() == k.sizes(), "q [B,H,1,D], K,V [B,Hkv,S,D]");
  TORCH_CHECK(q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat && v.scalar_type() == torch::kFloat,
              "float32 only");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1 && k.strides() == v.strides(), "K and V: same strides, rows dense");
  q = q.contiguous();
  auto mask = key_mask.to(torch::kBool).contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), Hkv = k.size(1), S = mask.size(1);
  TORCH_CHECK(H % Hkv == 0 && k.size(0) == B && k.size(3) == D && mask.size(0) == B && S <= k.size(2), "shapes");
  TORCH_CHECK(D % L == 0 && D / L <= 8, "head size D must be 16, 32, ..., 128");
  auto out = torch::zeros_like(q);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const bool* mp = mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const int64_t sb = k.stride(0), sh = k.stride(1), ss = k.stride(2), group = H / Hkv;
  at::parallel_for(0, B * H, 8, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(S);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, offset = b * sb + (i % H) / group * sh;
      const float *qi = qp + i * D, *ki = kp + offset, *vi = vp + offset;
      const bool* allowed = mp + b * S;
      float* oi = op + i * D;
      switch (D / L) {
        case 1: attend<1>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
        case 2: attend<2>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
        case 3: attend<3>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
        case 4: attend<4>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
        case 5: attend<5>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
        case 6: attend<6>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
        case 7: attend<7>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
        case 8: attend<8>(qi, ki, vi, allowed, S, ss, scale, p.data(), oi); break;
      }
    }
  });
  return out;
}
"""


@functools.cache
def kernel() -> Any:
    """The compiled extension (built once per machine, torch version and source), or None where it
    cannot be built here (not Linux on x86-64, no compiler, a build error), with a warning saying why."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        if shutil.which("ninja") is None:  # the `ninja` package's binary, when its venv is not on PATH
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        capability = torch.backends.cpu.get_cpu_capability().lower()
        version = torch.__version__.replace(".", "_").replace("+", "_")
        return load_inline(f"grpo_lab_decode_kernels_{capability}_{version}", cpp_sources=SOURCE,
                           functions=["skinny_linear", "decode_attention"],
                           extra_cflags=["-O3", "-march=native", "-fopenmp"],
                           extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # no compiler or ninja, a failed build: the decoder keeps torch's own
        warnings.warn(f"grpo_lab.lm.decoding.kernels: the decoding kernels could not be built ({type(exc).__name__}: "
                      f"{str(exc)[:300]}); decoding uses torch's linear and scaled_dot_product_attention",
                      stacklevel=2)
        return None


def built_for(*tensors: torch.Tensor) -> Any:
    """:func:`kernel` where it may run on ``tensors``: all float32 on the CPU and no gradient wanted
    through them (the kernels have no backward); else None."""
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


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """:func:`sdpa_attention`'s result for one query per row (shapes in the module docstring), through
    the kernel when everything is float32 on the CPU, D is 16, 32, …, 128, no gradient is wanted and
    the kernel is built."""
    one_query = (q.shape[2] == 1 and q.shape[3] % 16 == 0 and q.shape[3] <= 128 and keys.stride(-1) == 1
                 and keys.stride() == values.stride())
    built = built_for(q, keys, values) if one_query else None
    if built is None:
        return sdpa_attention(q, keys, values, key_mask, scale)
    return built.decode_attention(q, keys, values, key_mask, scale)


def sdpa_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """Attention of queries ``[B, H, 1, D]`` to the first S = ``key_mask.shape[-1]`` cached keys and values
    through ``torch.nn.functional.scaled_dot_product_attention``."""
    S = key_mask.shape[-1]
    mask = key_mask[:, None, None, :].bool()
    return F.scaled_dot_product_attention(q, keys[:, :, :S], values[:, :, :S], attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != keys.shape[1])


def use_for_decoding(model: torch.nn.Module) -> None:
    """Route every ``nn.Linear`` of ``model`` (a frozen sampler's copy decoding through its own
    forward) through :func:`linear`."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = types.MethodType(_linear_forward, module)


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias)
