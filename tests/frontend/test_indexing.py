"""The data-op rules (`xfuse.frontend.indexing`): what jax.numpy's indexing lowers to, and the
parameter combinations they refuse with FrontendError naming the primitive and the user's line.
The corpus (corpus_data.py) runs them end to end against jax.jit."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.frontend import FrontendError, trace
from xfuse.hlo import Op


def lowered_ops(fn, *args) -> list[Op]:
    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    module = trace(lambda *xs: [fn(*xs)], specs, [f"a{i}" for i in range(len(args))], "m")
    return [i.op for i in module.entry_computation]


def test_modes_and_fill_values_of_jnp_indexing():
    x, idx = np.ones((4, 5), np.float32), np.array([0, 7], np.int32)
    text = xfuse.jit(lambda x, i: (x[i], jnp.take(x, i, axis=1), x.at[i].add(1.0, mode="clip"))).lower(x, idx)
    text = text.as_text()
    assert "mode=promise_in_bounds" in text and "mode=fill_or_drop" in text and "mode=clip" in text
    assert "constant(nan)" in text  # jnp.take's default fill


def test_argsort_is_a_sort_with_an_iota_and_one_hot_is_a_comparison():
    x = np.ones((3, 4), np.float32)
    ops = lowered_ops(lambda x: jnp.argsort(x, axis=1), x)
    assert Op.IOTA in ops and Op.SORT in ops
    ops = lowered_ops(lambda i: jax.nn.one_hot(i, 5), np.array([1, 2], np.int32))
    assert Op.EQ in ops and not {Op.GATHER, Op.SCATTER} & set(ops)


def applies_sin(x, i):
    return x.at[i].apply(jnp.sin)


def test_a_scatter_applying_a_function_is_refused_naming_it_and_the_line():
    with pytest.raises(FrontendError) as info:
        xfuse.jit(applies_sin)(np.ones(5, np.float32), np.array([1], np.int32))
    line = inspect.getsourcelines(applies_sin)[1] + 1
    message = str(info.value)
    assert "'scatter'" in message and "x.at[i].apply(f)" in message
    assert f"test_indexing.py:{line} (applies_sin)" in message
