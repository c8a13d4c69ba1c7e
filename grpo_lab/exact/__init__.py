"""Exact computations, no sampling noise where it can be avoided: the contextual bandit (J, L_α, TV and
Theorem 1's bound in closed form), its loop with the gradient written by hand (the live panel's engine),
notebook 01's studies, SmolLM2 restricted to a finite answer set, exact J on a real LM, and a run that takes it as it
trains (notebook 02's live panel's engine)."""
