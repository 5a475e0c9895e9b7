"""Corpora present on every machine, for the demo and smoke runs (no network)."""
