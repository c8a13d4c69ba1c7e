"""The lag frontier: how far may α lag π_θ, with each correction, and still train as well as v = 1 (5 seeds)."""
