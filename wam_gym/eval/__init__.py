"""Closed-loop evaluation: ``python -m wam_gym.eval`` (see wam_gym/eval/config.py for the knobs)."""
