"""α's LeanDecoder against the model's own forward: HFSampler.sample of one batch, side by side in one run.

Two samplers of the same weights (bundled SmolLM2 fp32, CPU, both on 2 MiB pages with the decoding
kernel), one decoding with :class:`grpo_lab.decoder.LeanDecoder` (the default), one with
``lean_decoder=False`` (the model's forward over its ``DynamicCache``), sample the same prompts in
turn with the same seeds, ``--repeats`` times each after one warm-up each::

    python benchmarks/lean_decoder.py [--G 8] [--prompts 2] [--tokens 32] [--repeats 5]
"""

from __future__ import annotations

import argparse

from side_by_side import per_decoding_step, sample_in_turn, two_samplers

from grpo_lab.decoder import LeanDecoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    lean, model, batch = two_samplers(args.G, args.prompts, args.tokens, lean_decoder=False)
    if not isinstance(lean.decoder, LeanDecoder):
        raise SystemExit("the default sampler did not take LeanDecoder for this model")
    rounds = sample_in_turn({"LeanDecoder": lean, "model forward": model}, batch, args.G, args.repeats)
    per_decoding_step(rounds, f"HFSampler.sample, G={args.G}, P={args.prompts}, T_max={args.tokens}")


if __name__ == "__main__":
    main()
