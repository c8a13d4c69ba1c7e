"""Language models on the (v, i) loop: loading a model, log π_θ, the lagged sampler α (in-process or
vLLM), tasks and verifiable rewards, an LLM run's configuration, driver, checkpoints, evaluation, memory
guard, recipes and the ``grpo-lab`` command line."""
