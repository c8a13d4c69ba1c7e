"""α's LeanDecoder against the model's own forward: HFSampler.sample of one batch, side by side in one run.

Two samplers of the same weights (bundled SmolLM2 fp32, CPU, both on 2 MiB pages with the decoding
kernel), one decoding with :class:`grpo_lab.lm.decoding.decoder.LeanDecoder` (the default), one with
``lean_decoder=False`` (the model's forward over its ``DynamicCache``), sample the same prompts in
turn with the same seeds, ``--repeats`` times each after one warm-up each::

    python benchmarks/lean_decoder.py [--G 8] [--prompts 2] [--tokens 32] [--repeats 5]
"""

from __future__ import annotations

from side_by_side import per_decoding_step, sample_in_turn, sampling_parser, two_samplers

from grpo_lab.lm.decoding.decoder import LeanDecoder


def main() -> None:
    args = sampling_parser(__doc__).parse_args()
    lean, model, batch = two_samplers(args.G, args.prompts, args.tokens, lean_decoder=False)
    if not isinstance(lean.decoder, LeanDecoder):
        raise SystemExit("the default sampler did not take LeanDecoder for this model")
    rounds = sample_in_turn({"LeanDecoder": lean, "model forward": model}, batch, args.G, args.repeats)
    per_decoding_step(rounds, f"HFSampler.sample, G={args.G}, P={args.prompts}, T_max={args.tokens}")


if __name__ == "__main__":
    main()
