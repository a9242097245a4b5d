"""The training tasks both engines train on: the datasets (data) and their reward functions (rewards)."""
