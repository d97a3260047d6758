"""`xfuse demo`: the canonical workload, softmax(relu(x @ w + b)).

First built by hand with the HLO builder, printed, parsed back, verified and run on the
reference interpreter against numpy; then written in JAX, jitted with xfuse, its lowered HLO
printed and its result checked against jax.jit.
"""

from __future__ import annotations

import numpy as np

from . import hlo
from .hlo import Builder, DType, Loc, Module, Shape


def softmax_relu_module(batch: int = 64, features: int = 512, classes: int = 1024) -> Module:
    """The HLO of softmax(relu(x @ w + b), axis=-1), as the frontend will produce it."""
    f32 = DType.F32
    b = Builder("main", loc=Loc(__file__, 20, "softmax_relu_module"))
    x = b.parameter(Shape(f32, (batch, features)), "x")
    w = b.parameter(Shape(f32, (features, classes)), "w")
    bias = b.parameter(Shape(f32, (classes,)), "b")
    rows = (batch, classes)
    logits = b.add(
        b.dot_general(x, w, contracting=((1,), (0,))),
        b.broadcast_in_dim(bias, shape=rows, dims=(1,)),
    )
    relu = b.max(logits, b.broadcast_in_dim(b.constant(np.float32(0)), shape=rows, dims=()))
    row_max = b.broadcast_in_dim(b.reduce_max(relu, axes=(1,)), shape=rows, dims=(0,))
    exps = b.exp(b.sub(relu, row_max))
    row_sum = b.broadcast_in_dim(b.reduce_sum(exps, axes=(1,)), shape=rows, dims=(0,))
    return Module.of(b.build(b.div(exps, row_sum)), name="softmax_relu")


def numpy_softmax_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = np.maximum(x.astype(np.float64) @ w + b, 0.0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def mlp_softmax(x, w, b):
    import jax

    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def jit_demo(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> bool:
    import jax

    import xfuse

    f = xfuse.jit(mlp_softmax, tiers=False)  # compared below: xfuse's own kernels, not jax.jit's (`xfuse.tiers`)
    print("\n== xfuse.jit(mlp_softmax).lower(x, w, b).as_text() ==")
    print(f.lower(x, w, b).as_text())
    got = f(x, w, b)
    want = np.asarray(jax.jit(mlp_softmax)(x, w, b))
    error = float(np.max(np.abs(got - want)))
    ok = error < 1e-6
    print(f"xfuse.jit vs jax.jit: max abs error {error:.2e} ({'ok' if ok else 'MISMATCH'})")
    return ok


def builder_demo() -> bool:
    module = softmax_relu_module(batch=8, features=64, classes=32)
    text = str(module)
    print("== the module, built with xfuse.hlo.Builder ==")
    print(text)
    reparsed = hlo.parse(text)
    hlo.verify(reparsed)
    same = reparsed == module and str(reparsed) == text
    print(f"parsed back: {'structurally equal, same text' if same else 'DIFFERENT'}; verified")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64), dtype=np.float32)
    w = rng.standard_normal((64, 32), dtype=np.float32) / 8
    b = rng.standard_normal(32, dtype=np.float32)
    got = hlo.interpret(reparsed, x, w, b)
    want = numpy_softmax_relu(x, w, b)
    error = float(np.max(np.abs(got - want)))
    ok = same and error < 1e-6
    print(f"interpreter vs numpy: max abs error {error:.2e} ({'ok' if ok else 'MISMATCH'})")
    return ok


def main() -> int:
    ok = builder_demo()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 64), dtype=np.float32)
    w = rng.standard_normal((64, 32), dtype=np.float32) / 8
    b = rng.standard_normal(32, dtype=np.float32)
    ok = jit_demo(x, w, b) and ok
    return 0 if ok else 1
