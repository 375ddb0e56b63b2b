"""The training run: its config, the loop, checkpoints, torchrun plumbing, non-finite stops, profiling phases."""
