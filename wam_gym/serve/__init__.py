"""``python -m wam_gym.serve``: the batching policy server (openpi and vla-eval protocols)."""
