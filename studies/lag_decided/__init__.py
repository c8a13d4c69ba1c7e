"""The lag frontier, decided: does v = 10 with the paper correction train as well as v = 1 (design.py)."""
