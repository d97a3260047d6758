"""Random well-typed JAX programs for differential fuzzing, drawn by hypothesis.

A `Program` is straight-line code over its inputs: each `Step` assigns one new value from an
expression in `jnp`/`lax` over earlier values (elementwise ops with broadcasting and mixed
dtypes, python literals, conversions, reductions over random axes, dots with random dimension
numbers, reshapes, transposes, slices, pads, concatenations, flips, broadcasts, iotas). The
program returns one to three of its values. `Program.source()` is the program as Python text
(what a failure report shows) and `Program.function()` that text compiled.

Each step also names the `rule` that `tests.fuzz.bounds` uses to bound how far two correct
implementations may disagree on it. Shapes and dtypes come from `jax.eval_shape` on the step's
own expression, so jax's promotion rules (and x64 mode) are what they are, not a copy of them.
A step jax rejects is simply not drawn.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

NAMESPACE = {"jax": jax, "jnp": jnp, "lax": lax, "np": np}

FLOATS = ("float16", "bfloat16", "float32", "float64")
INPUT_DTYPES = ("float32", "float32", "float16", "bfloat16", "int32", "bool")
X64_DTYPES = INPUT_DTYPES + ("float64", "float64")
# Dimensions: mostly small, sometimes empty, sometimes large enough for the backends' parallel
# and blocked code paths (a value holds at most MAX_SIZE elements).
DIMS = (0, 1, 1, 2, 3, 3, 4, 5, 7, 8, 16, 33, 130)
MAX_SIZE = 1 << 16


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS

    @property
    def is_int(self) -> bool:
        return self.dtype.startswith(("int", "uint"))


@dataclass(frozen=True)
class Step:
    """`out = expr`; `rule` (with `params`) says how errors propagate through it."""

    out: Value
    expr: str
    operands: tuple[str, ...]
    rule: str
    params: tuple = ()


@dataclass(frozen=True)
class Program:
    inputs: tuple[Value, ...]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]
    x64: bool = False
    _fn: list = field(default_factory=list, compare=False, repr=False)

    def source(self) -> str:
        args = ", ".join(v.name for v in self.inputs)
        lines = [f"def program({args}):"]
        lines += [f"    {s.out.name} = {s.expr}" for s in self.steps]
        lines.append(f"    return ({', '.join(self.outputs)},)")
        return "\n".join(lines) + "\n"

    def function(self) -> Callable:
        if not self._fn:
            scope = dict(NAMESPACE)
            exec(compile(self.source(), "<fuzz program>", "exec"), scope)
            self._fn.append(scope["program"])
        return self._fn[0]

    def values(self) -> dict[str, Value]:
        return {v.name: v for v in self.inputs} | {s.out.name: s.out for s in self.steps}

    def describe(self) -> str:
        sig = ", ".join(f"{v.name}: {v.dtype}{list(v.shape)}" for v in self.inputs)
        return f"# x64={self.x64}; inputs {sig}\n{self.source()}"


# ---------------------------------------------------------------------------- op tables
# name: (template, rule, params); templates take operand names in order.
UNARY_FLOAT = {
    "exp": ("jnp.exp({})", "monotone", ("exp",)),
    "exp2": ("jnp.exp2({})", "monotone", ("exp2",)),
    "expm1": ("jnp.expm1({})", "monotone", ("expm1",)),
    "log": ("jnp.log({})", "monotone", ("log",)),
    "log1p": ("jnp.log1p({})", "monotone", ("log1p",)),
    "sqrt": ("jnp.sqrt({})", "monotone", ("sqrt",)),
    "rsqrt": ("lax.rsqrt({})", "monotone", ("rsqrt",)),
    "cbrt": ("jnp.cbrt({})", "monotone", ("cbrt",)),
    "tanh": ("jnp.tanh({})", "monotone", ("tanh",)),
    "logistic": ("jax.nn.sigmoid({})", "monotone", ("logistic",)),
    "erf": ("lax.erf({})", "monotone", ("erf",)),
    "atan": ("jnp.arctan({})", "monotone", ("atan",)),
    "sin": ("jnp.sin({})", "lipschitz", ("sin",)),
    "cos": ("jnp.cos({})", "lipschitz", ("cos",)),
    "floor": ("jnp.floor({})", "step", ("floor",)),
    "ceil": ("jnp.ceil({})", "step", ("ceil",)),
    "round": ("jnp.round({})", "step", ("round",)),
    "recip": ("1 / {}", "recip", ()),
    "square": ("jnp.square({})", "square", ()),
    "cube": ("{} ** 3", "cube", ()),
    "is_finite": ("jnp.isfinite({})", "exact", ()),
}
UNARY_NUMERIC = {
    "neg": ("-{}", "same", ()),
    "abs": ("jnp.abs({})", "same", ()),
    "sign": ("jnp.sign({})", "step", ("sign",)),
}
UNARY_INT_OR_BOOL = {"invert": ("~{}", "exact", ())}
BINARY_NUMERIC = {
    "add": ("{} + {}", "add", ()),
    "sub": ("{} - {}", "add", ()),
    "mul": ("{} * {}", "mul", ()),
    "max": ("jnp.maximum({}, {})", "maxmin", ()),
    "min": ("jnp.minimum({}, {})", "maxmin", ()),
}
BINARY_FLOAT = {
    "div": ("{} / {}", "div", ()),
    "pow": ("jnp.power({}, {})", "pow", ()),
    "atan2": ("jnp.arctan2({}, {})", "atan2", ()),
    "fmod": ("jnp.fmod({}, {})", "jump", (0,)),
    "remainder": ("jnp.remainder({}, {})", "jump", (2,)),
    "floor_divide": ("jnp.floor_divide({}, {})", "jump", (2,)),
}
BINARY_INT = {
    "floor_divide": ("jnp.floor_divide({}, {})", "exact", ()),
    "fmod": ("jnp.fmod({}, {})", "exact", ()),
    "remainder": ("jnp.remainder({}, {})", "exact", ()),
    "lax_div": ("lax.div(*jnp.broadcast_arrays({}, {}))", "exact", ()),
    "lax_rem": ("lax.rem(*jnp.broadcast_arrays({}, {}))", "exact", ()),
    "shift_left": ("jnp.left_shift({}, {})", "exact", ()),
    "shift_right": ("jnp.right_shift({}, {})", "exact", ()),
}
BITWISE = {"and": ("{} & {}", "exact", ()), "or": ("{} | {}", "exact", ()), "xor": ("{} ^ {}", "exact", ())}
COMPARE = {n: (f"{{}} {s} {{}}", "compare", ()) for n, s in
           (("lt", "<"), ("le", "<="), ("eq", "=="), ("ne", "!="), ("gt", ">"), ("ge", ">="))}
LITERALS = ("0", "1", "2", "-1", "0.5", "2.5", "-3.0", "1e-3", "100.0", "jnp.inf", "-jnp.inf", "jnp.nan")
REDUCTIONS = {
    "sum": ("jnp.sum", "sum"), "mean": ("jnp.mean", "mean"), "prod": ("jnp.prod", "prod"),
    "max": ("jnp.max", "reduce_maxmin"), "min": ("jnp.min", "reduce_maxmin"),
    "any": ("jnp.any", "exact_reduce"), "all": ("jnp.all", "exact_reduce"),
}
ARG_REDUCTIONS = ("jnp.argmax", "jnp.argmin")


# ---------------------------------------------------------------------------- building
class _Builder:
    """The program drawn so far; new inputs may be added by any step that needs an operand."""

    def __init__(self, r: random.Random, x64: bool):
        self.r = r
        self.x64 = x64
        self.inputs: list[Value] = []
        self.steps: list[Step] = []
        self.values: list[Value] = []

    def dtypes(self) -> tuple[str, ...]:
        return X64_DTYPES if self.x64 else INPUT_DTYPES

    def new_input(self, shape: tuple[int, ...], dtype: str | None = None) -> Value:
        dtype = dtype or self.r.choice(self.dtypes())
        shape = list(shape)
        while np.prod(shape) > MAX_SIZE // 4:
            shape[shape.index(max(shape))] = self.r.choice(DIMS[:8])
        value = Value(f"a{len(self.inputs)}", tuple(shape), dtype)
        self.inputs.append(value)
        self.values.append(value)
        return value

    def pick(self, accept: Callable[[Value], bool] = lambda v: True) -> Value | None:
        choices = [v for v in self.values if accept(v)]
        if not choices:
            return None
        # Later values are likelier, so programs grow deep as well as wide.
        index = self.r.randint(0, len(choices) - 1)
        late = self.r.random() < 0.5
        return choices[-1 - index // 2] if late else choices[index]

    def add(self, expr: str, operands: tuple[Value, ...], rule: str, params: tuple = ()) -> bool:
        """Adds `out = expr` if jax accepts it; returns whether it did."""
        names = tuple(v.name for v in operands)
        text = expr.format(*names)
        specs = [jax.ShapeDtypeStruct(v.shape, jnp.dtype(v.dtype)) for v in operands]
        try:
            out = jax.eval_shape(lambda *xs: eval(text, NAMESPACE, dict(zip(names, xs))), *specs)
        except Exception:  # noqa: BLE001 - a step jax rejects is not drawn
            return False
        if not isinstance(out, jax.ShapeDtypeStruct) or out.size > MAX_SIZE:
            return False
        value = Value(f"v{len(self.steps)}", tuple(out.shape), str(out.dtype))
        self.steps.append(Step(value, text, names, rule, params))
        self.values.append(value)
        return True


def _partner_shape(r: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape`: itself, some dimensions 1, a suffix, or ()."""
    kind = r.choice(("same", "same", "ones", "suffix", "scalar", "lead"))
    if kind == "ones":
        return tuple(1 if (r.random() < 0.5) else d for d in shape)
    if kind == "suffix":
        return shape[r.randint(0, len(shape)):]
    if kind == "scalar":
        return ()
    if kind == "lead" and len(shape) < 4:
        return (r.randint(1, 3),) + shape
    return shape


def _operand_for(b: _Builder, first: Value, dtypes: tuple[str, ...] | None) -> Value:
    """A second operand broadcasting with `first`: an earlier value or a new input."""
    def fits(v: Value) -> bool:
        if v.name == first.name or (dtypes and v.dtype not in dtypes):
            return False
        try:
            return np.broadcast_shapes(v.shape, first.shape) is not None
        except ValueError:
            return False

    other = b.pick(fits) if b.r.random() < 0.5 else None
    if other is None:
        dtype = b.r.choice(dtypes) if dtypes else None
        other = b.new_input(_partner_shape(b.r, first.shape), dtype)
    return other


def _elementwise(b: _Builder) -> bool:
    r = b.r
    kind = r.choice((("unary", "unary", "binary", "binary", "binary", "literal",
                                 "compare", "where", "convert", "clip")))
    x = b.pick(lambda v: v.dtype != "bool") if kind in ("literal", "clip") else b.pick()
    if x is None:
        return False
    if kind == "unary":
        table = dict(UNARY_NUMERIC) if x.dtype != "bool" else {}
        if x.is_float:
            table |= UNARY_FLOAT
        else:
            table |= UNARY_INT_OR_BOOL
        name = r.choice(sorted(table))
        return b.add(*_entry(table[name], (x,)))
    if kind == "binary":
        if x.is_float:
            table = BINARY_NUMERIC | BINARY_FLOAT
            dtypes = None
        elif x.is_int:
            table = BINARY_NUMERIC | BINARY_INT | BITWISE
            dtypes = (x.dtype,)  # shifts and lax.div/rem take equal dtypes
        else:
            table, dtypes = BITWISE | {"max": BINARY_NUMERIC["max"]}, ("bool",)
        name = r.choice(sorted(table))
        y = _operand_for(b, x, dtypes if name in BINARY_INT or name in BITWISE else None)
        if (r.random() < 0.5):
            x, y = y, x
        return b.add(*_entry(table[name], (x, y)))
    if kind == "literal":
        literal = r.choice(LITERALS)
        name = r.choice(("add", "sub", "mul", "div", "max", "min", "pow", "compare"))
        template = {
            "add": "{} + L", "sub": "L - {}", "mul": "{} * L", "div": "{} / L",
            "max": "jnp.maximum({}, L)", "min": "jnp.minimum({}, L)",
            "pow": "jnp.power({}, L)", "compare": "{} < L",
        }[name].replace("L", literal)
        rule = {"max": "maxmin", "min": "maxmin", "compare": "compare", "sub": "add"}.get(name, name)
        # the literal, and its place among the operands, for the bounds
        return b.add(template, (x,), rule, ("literal", _literal_value(literal), 0 if name == "sub" else 1))
    if kind == "compare":
        name = r.choice(sorted(COMPARE))
        y = _operand_for(b, x, None)
        return b.add(*_entry(COMPARE[name], (x, y)))
    if kind == "where":
        p = b.pick(lambda v: v.dtype == "bool")
        if p is None:
            return False
        y = _operand_for(b, x, (x.dtype,))
        return b.add("jnp.where({}, {}, {})", (p, x, y), "where")
    if kind == "convert":
        dtype = r.choice(b.dtypes())
        return b.add("{}.astype(jnp.%s)" % dtype, (x,), "convert")
    lo = r.choice((-2, -1, 0))
    return b.add(f"jnp.clip({{}}, {lo}, {lo + r.choice((1, 3))})", (x,), "same")


def _entry(entry: tuple, operands: tuple[Value, ...]) -> tuple:
    template, rule, params = entry
    return template, operands, rule, params


def _literal_value(text: str) -> float:
    return float(eval(text, NAMESPACE))


def _axes(r: random.Random, rank: int) -> tuple[int, ...]:
    return tuple(sorted(r.sample(range(rank), r.randint(1, rank))))


def _reduction(b: _Builder) -> bool:
    r = b.r
    x = b.pick(lambda v: len(v.shape) > 0)
    if x is None:
        return False
    keep = (r.random() < 0.5)
    if r.randint(0, 5) == 0:
        axis = r.randint(0, len(x.shape) - 1)
        fn = r.choice(ARG_REDUCTIONS)
        return b.add(f"{fn}({{}}, axis={axis}, keepdims={keep})", (x,), "arg", (axis, keep))
    name = r.choice(sorted(REDUCTIONS))
    fn, rule = REDUCTIONS[name]
    axes = _axes(r, len(x.shape))
    return b.add(f"{fn}({{}}, axis={axes}, keepdims={keep})", (x,), rule, (axes, keep))


def _dot(b: _Builder) -> bool:
    """lax.dot_general with random batch and contracting dimensions (or jnp.matmul), the
    other operand made to fit; described to the bounds as an einsum."""
    r = b.r
    x = b.pick(lambda v: len(v.shape) > 0 and v.dtype != "bool")
    if x is None:
        return False
    rank = len(x.shape)
    dims = list(range(rank))
    contract = sorted(r.sample(dims, r.randint(1, min(2, rank))))
    rest = [d for d in dims if d not in contract]
    batch = sorted(r.sample(rest, r.randint(0, 1))) if rest else []
    free_y = [r.choice(DIMS[1:]) for _ in range(r.randint(0, max(0, 3 - len(contract) - len(batch))))]
    # y's dimensions: batch, contracting and free, in a random order
    roles = [("b", d) for d in batch] + [("c", d) for d in contract] + [("f", i) for i in range(len(free_y))]
    order = r.sample(roles, len(roles))
    y_shape = tuple(x.shape[d] if r != "f" else free_y[d] for r, d in order)
    dtype = x.dtype if r.randint(0, 3) else None
    y = b.new_input(y_shape, x.dtype) if dtype else _existing_or_new(b, y_shape, x.dtype)
    y_contract = [order.index(("c", d)) for d in contract]
    y_batch = [order.index(("b", d)) for d in batch]
    preferred = ""
    # (not for a batched bf16 dot: XLA:CPU cannot run bf16 x bf16 = f32 with batch dimensions,
    # so the eager baseline could not either; the jax backend's tests cover it)
    if x.dtype in ("float16", "bfloat16") and (r.random() < 0.5) and not (batch and x.dtype == "bfloat16"):
        preferred = ", preferred_element_type=jnp.float32"
    expr = (f"lax.dot_general({{}}, {{}}, ((({', '.join(map(str, contract))},), "
            f"({', '.join(map(str, y_contract))},)), (({', '.join(map(str, batch))},), "
            f"({', '.join(map(str, y_batch))},))){preferred})").replace("(,)", "()")
    letters = iter(string.ascii_lowercase)
    xs = [next(letters) for _ in range(rank)]
    ys = []
    fy = {}
    for r, d in order:
        if r == "f":
            fy[d] = next(letters)
            ys.append(fy[d])
        else:
            ys.append(xs[d])
    y_free = [fy[d] for r, d in order if r == "f"]  # in y's order, as dot_general puts them
    out = [xs[d] for d in batch] + [xs[d] for d in rest if d not in batch] + y_free
    spec = f"{''.join(xs)},{''.join(ys)}->{''.join(out)}"
    return b.add(expr, (x, y), "dot", (spec,))


def _existing_or_new(b: _Builder, shape: tuple[int, ...], dtype: str) -> Value:
    found = b.pick(lambda v: v.shape == shape and v.dtype == dtype)
    return found if found is not None else b.new_input(shape, dtype)


def _layout(b: _Builder) -> bool:
    r = b.r
    x = b.pick()
    if x is None:
        return False
    rank = len(x.shape)
    kind = r.choice((("reshape", "transpose", "slice", "flip", "broadcast", "concat",
                                 "pad", "expand", "squeeze", "iota")))
    if kind == "reshape":
        size = int(np.prod(x.shape))
        if size:
            shape = (r.choice([f for f in range(1, 7) if size % f == 0]), -1)
        else:
            shape = r.choice(((0,), (1, 0), (0, 2)))
        return b.add(f"{{}}.reshape({shape})", (x,), "layout")
    if kind == "transpose" and rank > 1:
        perm = tuple(r.sample(range(rank), rank))
        return b.add(f"jnp.transpose({{}}, {perm})", (x,), "layout")
    if kind == "slice" and rank:
        parts = []
        for d in x.shape:
            start = r.randint(0, max(d - 1, 0))
            stop = r.randint(start, d)
            step = r.choice((1, 1, 2, -1))
            parts.append(f"{start}:{stop}:{step}" if step > 0 else "::-1")
        return b.add(f"{{}}[{', '.join(parts)}]", (x,), "layout")
    if kind == "flip" and rank:
        return b.add(f"jnp.flip({{}}, {r.randint(0, rank - 1)})", (x,), "layout")
    if kind == "broadcast":
        shape = (r.randint(1, 3),) + tuple(r.choice((d, 3)) if d == 1 else d for d in x.shape)
        return b.add(f"jnp.broadcast_to({{}}, {shape})", (x,), "layout")
    if kind == "concat" and rank:
        axis = r.randint(0, rank - 1)
        shape = tuple(r.randint(0, 3) if i == axis else d for i, d in enumerate(x.shape))
        y = _existing_or_new(b, shape, x.dtype)
        return b.add(f"jnp.concatenate([{{}}, {{}}], axis={axis})", (x, y), "layout")
    if kind == "pad" and rank:
        widths = tuple((r.randint(0, 2), r.randint(0, 2)) for _ in x.shape)
        return b.add(f"jnp.pad({{}}, {widths})", (x,), "layout")
    if kind == "expand":
        return b.add(f"jnp.expand_dims({{}}, {r.randint(0, rank)})", (x,), "layout")
    if kind == "squeeze" and 1 in x.shape:
        return b.add(f"jnp.squeeze({{}}, {x.shape.index(1)})", (x,), "layout")
    if kind == "iota":
        dtype = r.choice(("int32", "float32"))
        shape = tuple(r.choice(DIMS[1:]) for _ in range(r.randint(1, 2)))
        return b.add(f"lax.broadcasted_iota(jnp.{dtype}, {shape}, {len(shape) - 1})", (), "exact")
    return False


STEP_KINDS = (_elementwise,) * 5 + (_reduction, _dot, _layout, _layout)


@st.composite
def programs(draw, max_steps: int = 8) -> Program:
    """Hypothesis draws the program's size, x64 mode and a seed; the seed drives every other
    choice. Choices drawn from hypothesis directly lean hard towards the first of each list;
    a seeded generator is uniform, and shrinking still works where it matters: fewer steps
    give a prefix of the same program, with the same inputs."""
    seed = draw(st.integers(0, 2**32 - 1))
    x64 = draw(st.integers(0, 3)) == 0
    n_inputs = draw(st.integers(1, 2))
    n_steps = draw(st.integers(1, max_steps))
    r = random.Random(seed)
    with jax.enable_x64(x64):
        b = _Builder(r, x64)
        for _ in range(n_inputs):
            b.new_input(tuple(r.choice(DIMS) for _ in range(r.choice((0, 1, 2, 2, 3, 3)))))
        for _ in range(n_steps):
            for _attempt in range(4):
                if r.choice(STEP_KINDS)(b):
                    break
        if not b.steps:
            b.add("{} + {}", (b.inputs[0], b.inputs[0]), "add")
    names = [s.out.name for s in b.steps]
    extra = random.Random(seed + 1).sample(names, min(len(names), draw(st.integers(0, 2))))
    outputs = tuple(dict.fromkeys([names[-1]] + extra))
    return Program(tuple(b.inputs), tuple(b.steps), outputs, x64)


# ---------------------------------------------------------------------------- inputs
def _float_pool(dtype: np.dtype) -> list[float]:
    info = jnp.finfo(dtype)
    return [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, float(info.max), -float(info.max),
            float(info.tiny), -float(info.tiny), float(info.smallest_subnormal),
            -float(info.smallest_subnormal), float(info.eps), 2.5, -3.0, 100.0, 1e-3]


def make_inputs(program: Program, seed: int, edges: int) -> list[np.ndarray]:
    """Arguments for `program`: random values with up to `edges` in 8 drawn from the dtype's
    special values (NaN, +-inf, -0.0, subnormals, extremes; integer min and max)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for v in program.inputs:
        dtype = jnp.dtype(v.dtype)
        if v.dtype == "bool":
            arrays.append(rng.random(v.shape) < 0.5)
            continue
        if v.is_int:
            info = np.iinfo(dtype)
            x = rng.integers(-9, 10, v.shape)
            pool = [info.min, info.max, info.min + 1, 0, -1, 1, 31, 32, 33]
        else:
            x = rng.standard_normal(v.shape) * rng.choice([1.0, 4.0])
            pool = _float_pool(dtype)
        x = np.asarray(x, dtype=np.float64 if v.is_float else dtype)
        special = rng.random(v.shape) < edges / 8 * 0.5
        if special.any():
            picks = rng.choice(len(pool), size=int(special.sum()))
            x[special] = np.asarray([pool[i] for i in picks], x.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            arrays.append(np.asarray(x).astype(dtype))
    return arrays


@st.composite
def programs_with_inputs(draw, max_steps: int = 8) -> tuple[Program, list[np.ndarray]]:
    program = draw(programs(max_steps))
    seed = draw(st.integers(0, 2**32 - 1))
    edges = draw(st.sampled_from((0, 1, 2, 4)))
    return program, make_inputs(program, seed, edges)
