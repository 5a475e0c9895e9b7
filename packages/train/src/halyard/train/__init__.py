"""Halyard training: the Trainer, configs, optimizers, checkpoints, trackers and the CLI."""
