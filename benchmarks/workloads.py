"""The benchmark workloads: each one a JAX function (what xfuse.jit and jax.jit compile), a
hand-written NumPy version, optionally a numexpr version, and seeded float32 inputs.

`bytes_moved` counts inputs plus outputs once each: the least traffic any engine needs, the
numerator of the bandwidth fraction. Imports numpy at module level; jax and numexpr only inside
the functions that need them, so the suite's driver process stays light.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

GELU_C = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Workload:
    """One benchmark: the same computation written for every engine that can express it."""

    name: str
    description: str
    shapes: tuple[tuple[int, ...], ...]  # of the inputs, all float32
    out_shape: tuple[int, ...]
    jax_fn: Callable
    numpy_fn: Callable
    numexpr_fn: Callable | None = None
    memory_bound: bool = False  # report the fraction of copy bandwidth reached
    flops: int = 0  # matmul flops only (2 * m * n * k); 0 for elementwise/reduction workloads
    scales: tuple[float, ...] = field(default=())  # per input multiplier (default 1)

    def inputs(self, seed: int = 0) -> tuple[np.ndarray, ...]:
        """Seeded float32 inputs; weights are scaled so activations stay of order one."""
        rng = np.random.default_rng(seed)
        arrays = []
        for index, shape in enumerate(self.shapes):
            scale = self.scales[index] if index < len(self.scales) else 1.0
            array = rng.standard_normal(shape, dtype=np.float32)
            if scale != 1.0:
                array *= np.float32(scale)
            arrays.append(array)
        return tuple(arrays)

    def bytes_moved(self) -> int:
        """Inputs plus the output, each read or written once."""
        return 4 * (sum(math.prod(s) for s in self.shapes) + math.prod(self.out_shape))

    def engines(self) -> tuple[str, ...]:
        names = ("xfuse", "jax", "numpy")
        return names + ("numexpr",) if self.numexpr_fn is not None else names


# --------------------------------------------------------------------------- JAX versions


def jax_softmax_relu(x, w, b):
    import jax

    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def jax_softmax(x):
    import jax

    return jax.nn.softmax(x, axis=-1)


def jax_layer_norm(x, gamma, beta):
    import jax
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + 1e-5) * gamma + beta


def jax_gelu_mlp(x, w1, b1, w2, b2):
    import jax

    return jax.nn.gelu(x @ w1 + b1, approximate=True) @ w2 + b2


def jax_attention(q, k, v):
    import jax
    import jax.numpy as jnp

    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


def jax_chain(x):
    import jax
    import jax.numpy as jnp

    return jnp.tanh(x) * jax.nn.sigmoid(x * 1.5) + 0.5 * x


def jax_tiny(x):
    return x + 1.0


def jax_rnn_scan(xs, wx, wh, b):
    import jax
    import jax.numpy as jnp

    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh + b)
        return h, h

    h0 = jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype)
    return jax.lax.scan(cell, h0, xs)[1]


def jax_leaky_scan(xs):
    import jax
    import jax.numpy as jnp

    def cell(h, x):
        h = jnp.tanh(h * 0.9 + x)
        return h, h

    return jax.lax.scan(cell, jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]


# --------------------------------------------------------------------------- NumPy versions
# Written as a careful NumPy user would: in place where that saves a pass over memory. They
# also serve as the float64 reference (called on float64 copies of the inputs).


def np_softmax_rows(z: np.ndarray) -> np.ndarray:
    """Row softmax of `z`, in place."""
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def np_softmax_relu(x, w, b):
    z = x @ w
    z += b
    np.maximum(z, 0, out=z)
    return np_softmax_rows(z)


def np_softmax(x):
    return np_softmax_rows(x.copy())


def np_layer_norm(x, gamma, beta):
    centered = x - x.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(centered), axis=-1, keepdims=True)
    var += 1e-5
    centered *= 1.0 / np.sqrt(var)
    centered *= gamma
    centered += beta
    return centered


def np_gelu(h: np.ndarray) -> np.ndarray:
    """tanh-approximate GELU of `h`, in place."""
    inner = h * h
    inner *= 0.044715
    inner += 1.0
    inner *= h
    inner *= GELU_C
    np.tanh(inner, out=inner)
    inner += 1.0
    h *= 0.5
    h *= inner
    return h


def np_gelu_mlp(x, w1, b1, w2, b2):
    h = x @ w1
    h += b1
    out = np_gelu(h) @ w2
    out += b2
    return out


def np_attention(q, k, v):
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    scores *= 1.0 / math.sqrt(q.shape[-1])
    return np.matmul(np_softmax_rows(scores), v)


def np_chain(x):
    sig = x * -1.5
    np.exp(sig, out=sig)
    sig += 1.0
    np.reciprocal(sig, out=sig)
    sig *= np.tanh(x)
    sig += 0.5 * x
    return sig


def np_tiny(x):
    return x + 1.0


def np_rnn_scan(xs, wx, wh, b):
    hs = np.empty((xs.shape[0], xs.shape[1], wh.shape[1]), xs.dtype)
    h = np.zeros((xs.shape[1], wh.shape[1]), xs.dtype)
    for t in range(xs.shape[0]):
        h = np.matmul(xs[t], wx)
        h += np.matmul(hs[t - 1], wh) if t else 0.0
        h += b
        hs[t] = np.tanh(h, out=h)
    return hs


def np_leaky_scan(xs):
    hs = np.empty_like(xs)
    h = np.zeros(xs.shape[1:], xs.dtype)
    for t in range(xs.shape[0]):
        h *= xs.dtype.type(0.9)
        h += xs[t]
        np.tanh(h, out=h)
        hs[t] = h
    return hs


# --------------------------------------------------------------------------- numexpr versions
# Where numexpr can say the elementwise part; matmuls and reductions stay in NumPy. A float
# literal in a numexpr expression is a double and turns a float32 result into float64, so the
# constants are passed in as float32 variables.


def ne_softmax(x):
    import numexpr as ne

    m = x.max(axis=-1, keepdims=True)
    e = ne.evaluate("exp(x - m)")
    s = e.sum(axis=-1, keepdims=True)
    return ne.evaluate("e / s", out=e)


def ne_layer_norm(x, gamma, beta):
    import numexpr as ne

    m = x.mean(axis=-1, keepdims=True)
    centered = ne.evaluate("x - m")
    var = ne.evaluate("centered * centered").mean(axis=-1, keepdims=True)
    eps = np.float32(1e-5)  # a literal 1e-5 is a double and would make the result float64
    return ne.evaluate("centered / sqrt(var + eps) * gamma + beta", out=centered)


def ne_gelu_mlp(x, w1, b1, w2, b2):
    import numexpr as ne

    h = x @ w1
    c, a, half = np.float32(GELU_C), np.float32(0.044715), np.float32(0.5)
    g = ne.evaluate("half * (h + b1) * (1 + tanh(c * ((h + b1) + a * (h + b1) ** 3)))", out=h)
    out = g @ w2
    out += b2
    return out


def ne_chain(x):
    import numexpr as ne

    a, half = np.float32(-1.5), np.float32(0.5)
    return ne.evaluate("tanh(x) * (1 / (1 + exp(a * x))) + half * x")


def ne_tiny(x):
    import numexpr as ne

    return ne.evaluate("x + 1")


# --------------------------------------------------------------------------- the table


def _softmax_relu(batch: int, features: int, classes: int) -> Workload:
    return Workload(
        name=f"softmax_relu_{batch}x{features}x{classes}",
        description=f"softmax(relu(x @ w + b)), x[{batch},{features}] w[{features},{classes}]",
        shapes=((batch, features), (features, classes), (classes,)),
        out_shape=(batch, classes),
        jax_fn=jax_softmax_relu,
        numpy_fn=np_softmax_relu,
        flops=2 * batch * features * classes,
        scales=(1.0, 1.0 / math.sqrt(features), 0.1),
    )


def _chain(log2_size: int) -> Workload:
    size = 2**log2_size
    return Workload(
        name=f"tanh_sigmoid_chain_2^{log2_size}",
        description=f"tanh(x) * sigmoid(1.5 x) + 0.5 x on {size} floats",
        shapes=((size,),),
        out_shape=(size,),
        jax_fn=jax_chain,
        numpy_fn=np_chain,
        numexpr_fn=ne_chain,
        memory_bound=True,
    )


WORKLOADS: tuple[Workload, ...] = (
    _softmax_relu(1, 2048, 1000),
    _softmax_relu(64, 512, 1024),
    _softmax_relu(4096, 256, 1024),
    Workload(
        name="softmax_4096x1024",
        description="row softmax of x[4096,1024]",
        shapes=((4096, 1024),),
        out_shape=(4096, 1024),
        jax_fn=jax_softmax,
        numpy_fn=np_softmax,
        numexpr_fn=ne_softmax,
        memory_bound=True,
    ),
    Workload(
        name="layer_norm_4096x1024",
        description="layer norm of x[4096,1024] over rows, with gamma and beta",
        shapes=((4096, 1024), (1024,), (1024,)),
        out_shape=(4096, 1024),
        jax_fn=jax_layer_norm,
        numpy_fn=np_layer_norm,
        numexpr_fn=ne_layer_norm,
        memory_bound=True,
    ),
    Workload(
        name="gelu_mlp_256x1024x4096",
        description="gelu(x @ w1 + b1) @ w2 + b2, x[256,1024] w1[1024,4096] w2[4096,1024]",
        shapes=((256, 1024), (1024, 4096), (4096,), (4096, 1024), (1024,)),
        out_shape=(256, 1024),
        jax_fn=jax_gelu_mlp,
        numpy_fn=np_gelu_mlp,
        numexpr_fn=ne_gelu_mlp,
        flops=2 * 2 * 256 * 1024 * 4096,
        scales=(1.0, 1.0 / 32.0, 0.1, 1.0 / 64.0, 0.1),
    ),
    Workload(
        name="attention_8x8x256x64",
        description="softmax(q k^T / sqrt(d)) v, batch 8, 8 heads, sequence 256, head dim 64",
        shapes=((8, 8, 256, 64),) * 3,
        out_shape=(8, 8, 256, 64),
        jax_fn=jax_attention,
        numpy_fn=np_attention,
        flops=2 * 2 * 8 * 8 * 256 * 256 * 64,
    ),
    _chain(16),
    _chain(24),
    Workload(
        name="rnn_scan_128x16x256",
        description="h = tanh(x_t @ wx + h @ wh + b) scanned over 128 steps, batch 16, hidden 256",
        shapes=((128, 16, 256), (256, 256), (256, 256), (256,)),
        out_shape=(128, 16, 256),
        jax_fn=jax_rnn_scan,
        numpy_fn=np_rnn_scan,
        flops=2 * 2 * 128 * 16 * 256 * 256,
        scales=(1.0, 0.5 / 16.0, 0.5 / 16.0, 0.1),
    ),
    Workload(
        name="leaky_scan_1000x4096",
        description="h = tanh(0.9 h + x_t) scanned over 1000 steps of 4096 floats (elementwise)",
        shapes=((1000, 4096),),
        out_shape=(1000, 4096),
        jax_fn=jax_leaky_scan,
        numpy_fn=np_leaky_scan,
        memory_bound=True,
    ),
    Workload(
        name="tiny_add_4",
        description="x + 1 on 4 floats: the per-call overhead",
        shapes=((4,),),
        out_shape=(4,),
        jax_fn=jax_tiny,
        numpy_fn=np_tiny,
        numexpr_fn=ne_tiny,
    ),
)

BY_NAME: dict[str, Workload] = {w.name: w for w in WORKLOADS}


def named(items: tuple, patterns: list[str] | None, noun: str) -> list:
    """The `items` whose name contains any of `patterns` (all when none given); SystemExit
    listing them (`noun`s) when none does."""
    if not patterns:
        return list(items)
    chosen = [item for item in items if any(p in item.name for p in patterns)]
    if not chosen:
        names = ", ".join(item.name for item in items)
        raise SystemExit(f"--only {' '.join(patterns)} matches no {noun}; the {noun}s: {names}")
    return chosen


def select(patterns: list[str] | None) -> list[Workload]:
    """The workloads whose name contains any of `patterns` (all when none given)."""
    return named(WORKLOADS, patterns, "workload")


def reference(workload: Workload, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The float64 NumPy result, the yardstick every engine's output is checked against."""
    return workload.numpy_fn(*(a.astype(np.float64) for a in inputs))


def check(output: np.ndarray, expected: np.ndarray) -> dict:
    """Agreement with the float64 reference, with a float32 tolerance scaled to the output."""
    output = np.asarray(output)
    scale = float(np.max(np.abs(expected))) if expected.size else 1.0
    error = float(np.max(np.abs(output.astype(np.float64) - expected))) if expected.size else 0.0
    shape_ok = tuple(output.shape) == tuple(expected.shape)
    tolerance = 2e-3 * max(scale, 1e-6)
    ok = bool(shape_ok and output.dtype == np.float32 and np.isfinite(error) and error <= tolerance)
    return {
        "ok": ok,
        "dtype": str(output.dtype),
        "shape_ok": shape_ok,
        "max_abs_err": error,
        "max_rel_err": error / max(scale, 1e-30),
        "tolerance": tolerance,
    }
