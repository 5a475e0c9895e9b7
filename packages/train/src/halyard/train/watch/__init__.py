"""Seeing inside a run: ``trainer.watch`` (norms per module and per layer, what the model reports, histograms,
computed by a second compiled step every N steps) and ``trainer.spikes`` (a rolling z-score test of the loss
that names the worst examples' documents).

    norms = module_norms(grads, "grad_norm")     # inside the watched step: {"grad_norm/embed": ..., ...}
    flat = flatten_arrays(norms)                 # on the host: {"grad_norm/layers/0": 1.2, ...}
"""
