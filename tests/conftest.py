"""Shared pytest set-up: a hypothesis profile with no deadline (2-core CI machines are slow
and jit compiles vary), derandomised under CI so failures reproduce."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    derandomize=True,
)
settings.load_profile("ci" if os.environ.get("CI") else "default")
