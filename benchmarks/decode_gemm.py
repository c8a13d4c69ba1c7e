"""The decoding kernel (grpo_lab.lm.decoding.kernels) against MKL's GEMM (F.linear), side by side in one run.

1. The products of one SmolLM2-135M decoding step as LeanDecoder runs them (4 per block: q/k/v,
   o, gate/up, down; 30 blocks, and the tied LM head; float32, on 2 MiB pages as α's are) for M
   rows, interleaved, each timed ``--repeats`` times: ms per step, weights read per second.
2. HFSampler.sample of one batch (bundled SmolLM2, CPU) with ``fast_decode`` True and False,
   same prompts and seeds, medians after a warm-up each, per decoding step (the sums' other order
   can flip a draw that falls at a boundary of the CDF, and a flipped completion may end sooner;
   the share of identical tokens is printed)::

    python benchmarks/decode_gemm.py [--rows 1 8 16 32] [--G 8] [--prompts 2] [--tokens 32] [--repeats 5]
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from side_by_side import per_decoding_step, sample_in_turn, sampling_parser, timed_once, two_samplers

from grpo_lab.lm.decoding import kernels as decode_kernels
from grpo_lab.lm.decoding.decoder import pack_weights

HIDDEN, INTERMEDIATE, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152  # SmolLM2-135M


def step_weights() -> list[torch.Tensor]:
    """One decoding step's weight matrices, [N, K], in the order LeanDecoder reads them (q/k/v and
    gate/up fused)."""
    block = [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
    weights = [torch.randn(n, k) for n, k in block * LAYERS + [(VOCAB, HIDDEN)]]
    pack_weights([[w] for w in weights])
    return weights


def products(rows: list[int], repeats: int) -> None:
    weights = step_weights()
    gigabytes = sum(w.numel() * w.element_size() for w in weights) / 1e9
    print(f"1. one SmolLM2 decoding step's products ({gigabytes:.2f} GB of weights), median of {repeats}")
    with torch.no_grad():
        for m in rows:
            pairs = [(torch.randn(m, w.shape[1]), w) for w in weights]
            ways = {"MKL": lambda pairs=pairs: [F.linear(x, w) for x, w in pairs],
                    "kernel": lambda pairs=pairs: [decode_kernels.linear(x, w) for x, w in pairs]}
            times: dict[str, list[float]] = {name: [] for name in ways}
            for repeat in range(repeats + 1):
                for name, way in ways.items():
                    elapsed = timed_once(way)
                    if repeat:
                        times[name].append(elapsed)
            mkl, kernel = (statistics.median(times[name]) for name in ways)
            used = "kernel" if m <= decode_kernels.DECODE_ROWS else "F.linear (M > DECODE_ROWS)"
            print(f"  M = {m:3d}: MKL {mkl * 1e3:6.1f} ms ({gigabytes / mkl:4.1f} GB/s), decode_kernels.linear "
                  f"{kernel * 1e3:6.1f} ms ({gigabytes / kernel:4.1f} GB/s; {used}): ratio {kernel / mkl:.2f}")


def sampling(G: int, prompts: int, tokens: int, repeats: int) -> None:
    fast, plain, batch = two_samplers(G, prompts, tokens, fast_decode=False)
    if not fast.fast_decode:
        raise SystemExit("the decoding kernel did not build on this machine (see the warning above)")
    rounds = sample_in_turn({"kernel": fast, "MKL": plain}, batch, G, repeats)
    per_decoding_step(rounds, f"2. HFSampler.sample, G={G}, P={prompts}, T_max={tokens}")


def main() -> None:
    parser = sampling_parser(__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32])
    args = parser.parse_args()
    if decode_kernels.kernel() is None:
        raise SystemExit("the decoding kernel did not build on this machine (see the warning above)")
    print(f"{torch.get_num_threads()} torch threads")
    products(args.rows, args.repeats)
    sampling(args.G, args.prompts, args.tokens, args.repeats)


if __name__ == "__main__":
    main()
