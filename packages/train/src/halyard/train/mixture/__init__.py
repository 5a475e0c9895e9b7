"""Training on a mixture of sources: ``data.mixture`` (named sources with their own caches, weights and a
step schedule of weights), per-source training and validation losses, and resuming with changed weights
only when ``data.allow_mixture_change`` says so (packages/train/README.md, "Mixtures"). The sources' caches
and the mixed batches are assembled in halyard.train.data_assembly (mixture_build, mixture_batches)."""
