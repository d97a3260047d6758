"""xfuse.frontend: JAX functions to `xfuse.hlo` modules, through `jax.make_jaxpr`.

May import xfuse.hlo and jax.
"""
