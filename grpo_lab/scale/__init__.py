"""Scaling the recipe: the TRL adapter (Algorithm 1 on TRL's ``GRPOTrainer`` with vLLM), the GPU
launcher, the cost model step(v) = gen + train + sync / v and measured step costs."""
