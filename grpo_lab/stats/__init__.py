"""The statistics the studies use, which know no study: Student's t and intervals over seeds, paired tests and
Holm's adjustment (:mod:`~grpo_lab.stats.paired`), first passage and time ratios (:mod:`~grpo_lab.stats.passage`),
and group-sequential looks (:mod:`~grpo_lab.stats.sequential`)."""
