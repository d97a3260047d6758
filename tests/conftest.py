"""Shared pytest set-up: a hypothesis profile with no deadline (2-core CI machines are slow
and jit compiles vary), derandomised under CI so failures reproduce; a kernel cache directory
of the session's own; jax.jit, the tests' yardstick, multiplying f32 in f32 on every device, as
xfuse's backends do (a GPU's default would round the products' inputs to tf32)."""

import os

import jax
from hypothesis import HealthCheck, settings

jax.config.update("jax_default_matmul_precision", "highest")

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

# Calls run native code from the first one (`xfuse.tiers`), so that a test sees the backend it
# names; tests/test_tiers.py turns tiers on where it tests them.
os.environ.setdefault("XFUSE_TIERS", "0")

# Kernels compiled by the tests go to a cache of the session's own, not the user's.
if "XFUSE_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _cache = tempfile.mkdtemp(prefix="xfuse-test-cache-")
    os.environ["XFUSE_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)
