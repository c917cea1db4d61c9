"""Settings for the whole suite: hypothesis judges examples by what they find, not by how
long a busy machine takes to run them (no per-example deadline, no too-slow check)."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("suite")
