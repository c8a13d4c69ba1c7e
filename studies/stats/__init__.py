"""The statistics only the studies use, which know no study: how two arms compare over seeds (paired tests, Holm,
sign-flip, Welch TOST: :mod:`~studies.stats.comparisons`) and first-passage times with their ratios
(:mod:`~studies.stats.passage`). The intervals the library itself reads are :mod:`grpo_lab.stats`."""
