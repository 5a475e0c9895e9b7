"""DoReMi (Xie et al. 2023): learn a data mixture's weights with a small proxy model trained by Group DRO
against a reference model (``trainer.objective: doremi``, ``halyard doremi``; docs/guides/doremi)."""
