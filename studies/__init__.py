"""The studies: each one a question about off-policy GRPO, its fixed design, runner, results and README."""
