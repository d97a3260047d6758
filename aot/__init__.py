"""xfuse.aot: writing ahead-of-time artifacts, and the command line around them.

May import xfuse.hlo, xfuse.backends and xfuse.runtime.
"""
