"""Time to accuracy against TRL's GRPOTrainer: how soon the loop reaches fixed exact-J targets, and why."""
