"""The CPU study behind notebook 02: running its units (:mod:`~grpo_lab.study.cpu_study`), its design and
the reader of its folder (:mod:`~grpo_lab.study.design`), and the statistics, which know no study: confidence
intervals and paired tests (:mod:`~grpo_lab.study.results`)."""
