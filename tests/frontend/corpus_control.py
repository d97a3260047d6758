"""Corpus cases for control flow: lax.cond, lax.switch, lax.while_loop, lax.fori_loop, lax.scan.

Imported by `test_corpus.py` once its `case` decorator and input helpers exist; each case
registers itself there and runs in every corpus test (jax.jit against each backend).
"""

from __future__ import annotations

from tests.frontend.test_corpus import NORMWISE, case, floats, integers  # noqa: F401
