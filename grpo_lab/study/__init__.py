"""The CPU study behind notebook 02: running its units (:mod:`~grpo_lab.study.cpu_study`) and reading
them with confidence intervals and paired tests (:mod:`~grpo_lab.study.results`)."""
