"""Leaf utilities any layer may use: atomic publish, video I/O, image metrics, CLI errors, and the
statistics of results (intervals, paired comparisons, anytime-valid stopping: ``stats``).

Nothing here imports ``envs``, ``agents``, ``training`` or the rest of ``wam_gym``
(tests/test_layers.py checks it), so ``envs`` can use it without pointing up the stack.
"""
