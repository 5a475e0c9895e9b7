"""Training objectives beyond next-token prediction: direct preference optimisation (DPO).

``trainer.objective: dpo`` with ``data.format: preference`` trains on (prompt, chosen, rejected) pairs
against a frozen reference model, the run's initial weights (see packages/train/README.md, "Preference
optimisation (DPO)").
"""
