"""α's decoding forward behind one seam (:class:`~grpo_lab.lm.decoding.decoder.Decoder`: prefill,
repeat, step): the model's own forward, or a lean one for Llama/Qwen2 on a CPU."""
