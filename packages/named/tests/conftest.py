"""Shared test settings: modest hypothesis budgets so the suite stays fast on 2 cores."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "halyard",
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("halyard")
