"""α's weights on 2 MiB pages against 4 KiB pages: HFSampler.sample of one batch, side by side in one run.

Two samplers of the same weights (bundled SmolLM2 fp32, CPU), one built with ``huge_pages=True``
(the default: one buffer advised with ``madvise(MADV_HUGEPAGE)``), one with ``huge_pages=False``,
sample the same prompts in turn (same seeds, so the same tokens), ``--repeats`` times each after
one warm-up each. Decoding reads every weight once per token, so it is bound by memory reads and
by the TLB misses of 4 KiB pages::

    python benchmarks/huge_pages.py [--G 8] [--prompts 2] [--tokens 32] [--repeats 5]
"""

from __future__ import annotations

import statistics

import torch
from side_by_side import sample_in_turn, sampling_parser, two_samplers


def main() -> None:
    args = sampling_parser(__doc__).parse_args()
    huge, small, batch = two_samplers(args.G, args.prompts, args.tokens, huge_pages=False)
    if not huge.huge_pages:
        raise SystemExit("this machine gave no huge pages (not Linux, or transparent huge pages set to never)")
    rounds = sample_in_turn({"2 MiB": huge, "4 KiB": small}, batch, args.G, args.repeats)
    for (_, a), (_, b) in zip(rounds["2 MiB"], rounds["4 KiB"], strict=True):
        assert torch.equal(a, b), "the two samplers drew different tokens"
    seconds = {name: [s for s, _ in values] for name, values in rounds.items()}
    median = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"G={args.G}, P={args.prompts}, {args.tokens} tokens, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} (after a warm-up each)")
    for name, values in seconds.items():
        print(f"  α on {name} pages: {median[name]:.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"ratio 2 MiB / 4 KiB: {median['2 MiB'] / median['4 KiB']:.2f}")


if __name__ == "__main__":
    main()
