"""``halyard plan``: before launch, whether a run fits its devices and how fast it can go.

    halyard plan --config llama-8b --devices 64 --accelerator h100

Memory per device comes from XLA's memory analysis of the run's compiled train step on abstract
inputs (simulated CPU devices stand in for the accelerators); FLOPs per token from the model, and
the step time at a chosen MFU from the peaks table.
"""
