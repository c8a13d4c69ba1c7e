"""The studies, on exact J: notebook 02's lag frontier (:mod:`~grpo_lab.study.frontier`: its design, analysis and
units); notebook 03's time to accuracy against TRL (:mod:`~grpo_lab.study.time_to_accuracy`: the design and unit
order; :mod:`~grpo_lab.study.tta_units`: the units on a training clock; :mod:`~grpo_lab.study.tta_trl`: TRL's
side; :mod:`~grpo_lab.study.passage`: first passage and time ratios; :mod:`~grpo_lab.study.tta_summary`: the
summary); and the statistics, which know no study:
Student's t, confidence intervals and the pairing by seed (:mod:`~grpo_lab.study.results`)."""
