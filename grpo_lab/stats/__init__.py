"""Statistics over seeds, which know no study: Student's t and its intervals (:mod:`~grpo_lab.stats.intervals`,
read by the throughput repeats) and group-sequential looks (:mod:`~grpo_lab.stats.sequential`). The comparisons
and first-passage statistics only the studies use live in the study wing, ``studies/stats/``."""
