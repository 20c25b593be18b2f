"""Training World Action Models: datasets, demo collection, the training loop (python -m training)."""
