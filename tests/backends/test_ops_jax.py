"""Every op x dtype of the op table on the jax backend against the reference interpreter, with
the trials of the numba backend's suite (edge values and seeded random inputs, per-op
tolerances), in both of the backend's modes:

- "fusions": each op x dtype alone on its first trial (the edge values), unfused, so the op is
  a top-level kernel, one `jax.jit` function of its own (a constant is an argument put on the
  device, a tuple a Python value);
- "module": per op, the other trials `chosen_trials` picks (the attribute variants: axes,
  slices, permutations... rotated through the dtypes) in one module, each inside a fusion of
  its own, run as a single `jax.jit` function (so constants are closure values of nested
  functions); an op with no other trial runs its first dtype's edge values.

So every trial of the numba suite runs once, and every op in both modes. On a device other
than the CPU (jax's default device is where the backend runs), an element may also equal, bit
for bit, what `jax.jit` itself gives there: the reference follows XLA:CPU, and XLA:GPU, for one,
rounds f32 division and square roots to within an ulp. Compiling is nearly
all of the run time, about 40 ms per op XLA compiles (separately or in one module alike): some
700 kernels in fusions mode, 360 fusions in module mode. The suite runs with jax's x64 mode
as the session has it (off, by default): the backend turns it on around 64-bit modules itself.
"""

from __future__ import annotations

import traceback

import jax
import numpy as np
import pytest

import xfuse
from tests.backends.test_ops_numba import CASES, check_trial, chosen_trials, module_of, run_on
from tests.hlo.test_ops_vs_jax import SPECS, Trial, lax_results, trials_of
from xfuse.backends.jax import compile_module, emit
from xfuse.hlo import Builder, DType, Loc, Module, Op, Shape, TupleShape


def run_fusions(op: Op, trial: Trial) -> object:
    module, tupled = module_of(op, trial)
    outputs = run_on(compile_module(module, mode="fusions"), trial, tupled)
    for output in outputs if tupled else (outputs,):
        assert isinstance(output, jax.Array), f"{op}: got a {type(output).__name__}, not a jax array"
    return outputs


def on_the_device(op: Op, dtype: DType, trial: Trial) -> object:
    """XLA's own result for `trial` on jax's default device; None where that is the CPU."""
    platform = jax.devices()[0].platform
    if platform == "cpu":
        return None
    (k,) = [k for k, t in enumerate(trials_of(op, dtype)) if t is trial]
    return lax_results(op, platform)[dtype][k]


@pytest.mark.parametrize("op, dtype", CASES, ids=[f"{op}-{dtype}" for op, dtype in CASES])
def test_op_matches_reference(op: Op, dtype: DType) -> None:
    trial = chosen_trials(op, dtype)[0]  # the edge values; module mode runs the other trials
    check_trial("jax", op, dtype, trial, lambda t: run_fusions(op, t), on_the_device(op, dtype, trial))


# ---------------------------------------------------------------------------- module mode
def fused_trial(b: Builder, op: Op, trial: Trial, k: int):
    """The trial's op inside a loop fusion of its own, called on new parameters of `b`:
    (the fused computation, the fusion's results (one per tuple element), whether a tuple)."""
    inner = Builder(f"fused_{op}_{k}")
    params = [inner.parameter(Shape.of(a), f"p{i}") for i, a in enumerate(trial.arrays)]
    if trial.build is not None:
        root = trial.build(inner, *params)
    else:
        root = inner.emit(op, *params, **trial.attrs)
    computation = inner.build(root)
    outer = [b.parameter(Shape.of(a), f"t{k}_p{i}") for i, a in enumerate(trial.arrays)]
    fusion = b.emit(Op.FUSION, *outer, kind="loop", calls=computation.name, shape=root.shape)
    if not isinstance(root.shape, TupleShape):
        return computation, [fusion], False
    elements = [b.get_tuple_element(fusion, index=i) for i in range(len(root.shape.elements))]
    return computation, elements, True


def module_trials(op: Op) -> list[tuple[DType, int, Trial]]:
    """The trials module mode runs: those of `chosen_trials` that fusions mode leaves (the
    attribute variants past the first), or, for an op with none, its first dtype's first."""
    runs = [(d, k, t) for d in SPECS[op].dtypes for k, t in enumerate(chosen_trials(op, d)) if k]
    if not runs:
        dtype = SPECS[op].dtypes[0]
        runs = [(dtype, 0, chosen_trials(op, dtype)[0])]
    return runs


def module_results(op: Op, runs: list[tuple[DType, int, Trial]]) -> list[object]:
    """Each run's result, from one module holding them all, run in "module" mode."""
    b = Builder("main")
    computations, outputs, spans = [], [], []
    for _, _, trial in runs:
        called, results, tupled = fused_trial(b, op, trial, len(spans))
        computations.append(called)
        spans.append((len(outputs), len(results), tupled))
        outputs += results
    executable = compile_module(Module.of(b.build(b.tuple(*outputs)), *computations), mode="module")
    got = executable([a for _, _, trial in runs for a in trial.arrays])
    assert len(got) == len(outputs)
    return [tuple(got[at : at + count]) if tupled else got[at] for at, count, tupled in spans]


@pytest.mark.parametrize("op", list(SPECS), ids=str)
def test_module_mode_matches_reference(op: Op) -> None:
    runs = module_trials(op)
    for (dtype, _, trial), result in zip(runs, module_results(op, runs)):
        check_trial("jax module", op, dtype, trial, lambda t: result, on_the_device(op, dtype, trial))


# ---------------------------------------------------------------------------- the backend itself
def test_every_op_has_a_rule() -> None:
    assert set(Op) == emit.RULES.keys() | emit.LEAVES
    calling = {Op.FUSION, Op.CALL, Op.WHILE, Op.CONDITIONAL}  # tests/*/test_control.py, the corpus
    # a callback: tests/frontend/test_host_callback.py runs it on every backend
    assert set(SPECS) | {Op.PARAMETER, Op.CALLBACK} | calling == set(Op)  # what the suites run


def test_unknown_mode_names_the_option() -> None:
    module, _ = module_of(Op.NEG, chosen_trials(Op.NEG, DType.F32)[0])
    with pytest.raises(ValueError, match="mode='fast'"):
        compile_module(module, mode="fast")


def test_device_places_inputs_and_outputs() -> None:
    device = jax.devices()[-1]
    trial = chosen_trials(Op.ADD, DType.S64)[0]  # 64-bit: run inside the backend's x64 scope
    module, _ = module_of(Op.ADD, trial)
    for mode, given in [("fusions", device), ("module", f"{device.platform}:{device.id}")]:
        executable = compile_module(module, mode=mode, device=given)
        assert (executable.mode, executable.device) == (mode, device)
        (out,) = executable(list(trial.arrays))
        assert out.devices() == {device} and out.dtype == np.int64
        np.testing.assert_array_equal(np.asarray(out), trial.arrays[0] + trial.arrays[1])
    with pytest.raises(ValueError, match="device='tpu:7'"):
        compile_module(module, device="tpu:7")


def test_traceback_shows_the_generated_line_and_the_users_line(monkeypatch) -> None:
    # a rule that writes a call that fails as the kernel is traced
    monkeypatch.setitem(emit.RULES, Op.NEG, lambda c: f"lax.neg({c.args[0]}, {c.args[0]})")
    b = Builder("main", loc=Loc("model.py", 12, "layer"))
    x = b.parameter(Shape(DType.F32, (4,)), "x")
    executable = compile_module(Module.of(b.build(b.neg(x))))
    with pytest.raises(TypeError) as failure:
        executable([np.ones(4, np.float32)])
    text = "".join(traceback.format_exception(failure.value))
    assert "neg_0 = lax.neg(x, x)  # f32[4]  at model.py:12 (layer)" in text


def test_kernel_source_names_instructions_and_source_lines() -> None:
    b = Builder("main")
    x = b.parameter(Shape(DType.F32, (4,)), "x")
    y = b.exp(b.neg(x))
    executable = compile_module(Module.of(b.build(y)), mode="fusions")
    assert set(executable.kernel_sources) == {"neg.0", "exp.1"}
    assert "lax.exp(neg_0)" in executable.kernel_sources["exp.1"]
    assert "neg_0 = jit_kernel_neg_0(x)" in executable.driver_source


@pytest.mark.parametrize("mode", ["fusions", "module"])
def test_min_and_max_reductions_propagate_nan_where_xla_cpu_drops_it(mode) -> None:
    """XLA:CPU reduces a matrix's columns in blocks of rows and can lose a block holding a NaN
    (jnp.min gives -9.46 here, neither NaN nor the column's -65504); the backend must not."""
    column = np.full(32, 3.0, np.float32)
    column[[1, 16, 24]] = [-9.46, np.nan, -65504.0]
    x = np.ones((32, 130), np.float32)
    x[:, 8] = column
    for fn in (lambda a: a.min(axis=0), lambda a: a.max(axis=0), lambda a: -a.min(axis=0)):
        got = np.asarray(xfuse.jit(fn, backend="jax", backend_options={"mode": mode})(x))
        want = np.where(np.isnan(x).any(axis=0), np.nan, np.asarray(fn(x.astype(np.float64)), np.float32))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["fusions", "module"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, jax.numpy.bfloat16])
def test_exp_of_a_nan_a_constant_puts_in_is_nan(mode, dtype) -> None:
    """XLA:CPU's exp and exp2 (and in bfloat16 expm1 and logistic) of a NaN LLVM sees at
    compile time (x + nan, min(x, nan) with the NaN a constant of the fusion) give 0, tiny or
    large numbers (jax.jit too); the backend's must be NaN, and of runtime values unchanged."""
    jnp = jax.numpy
    nan = dtype(np.nan)
    x = np.array([3, 1, 0.5, -2, np.inf, -np.inf, 100, -100, np.nan, -0.0], dtype)
    options = {"mode": mode}
    for fn in (lambda a: jnp.exp(a + nan), lambda a: jnp.exp2(jnp.minimum(a, nan)),
               lambda a: jnp.exp(a * nan) * 2, lambda a: jnp.expm1(a + nan),
               lambda a: jax.nn.sigmoid(jnp.minimum(a, nan))):
        got = np.asarray(xfuse.jit(fn, backend="jax", backend_options=options)(x))
        assert np.isnan(got.astype(np.float32)).all(), got
    for fn in (jnp.exp, jnp.exp2, jnp.expm1, jax.nn.sigmoid):
        got = np.asarray(xfuse.jit(fn, backend="jax", backend_options=options)(x))
        np.testing.assert_array_equal(got.astype(np.float32), np.asarray(jax.jit(fn)(x)).astype(np.float32))


@pytest.mark.parametrize("mode", ["fusions", "module"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_a_narrow_integer_dot_with_a_wide_result_is_exact(mode, dtype) -> None:
    # XLA:GPU's s8 x s8 = s32 product over 5 terms gave twice the sum (an H200, jax 0.11.2):
    # the backend widens integer operands to the result's type first, which keeps the
    # wrapped sum; on the default device, a GPU where there is one
    jnp = jax.numpy
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    fn = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.int32))
    for k in (1, 5, 8, 13):
        a = rng.integers(info.min, info.max, (3, k), endpoint=True).astype(dtype)
        b = rng.integers(info.min, info.max, (k, 4), endpoint=True).astype(dtype)
        a[0], b[:, 0] = info.min, info.min  # the largest products, and a wrapping sum for int16
        compiled = xfuse.jit(fn, backend="jax", backend_options={"mode": mode})
        got = np.asarray(compiled(a, b))
        want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want, err_msg=f"k={k}")
    assert "lax.convert_element_type" in compiled.lower(a, b).compile().kernel_source()


@pytest.mark.parametrize("mode", ["fusions", "module"])
@pytest.mark.parametrize("batched", [True, False])
def test_a_bfloat16_dot_with_a_float32_result_runs(mode, batched) -> None:
    # XLA:CPU has no batched bf16 x bf16 = f32 dot (UNIMPLEMENTED, in jax.jit too): the
    # backend widens half operands to f32 first, which keeps the result (their products are
    # exact in f32)
    from jax import lax

    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 5, 4)).astype(jax.numpy.bfloat16)
    b = rng.standard_normal((16, 2, 5)).astype(jax.numpy.bfloat16)
    batch = ((0,), (1,)) if batched else ((), ())

    def fn(x, y):
        return lax.dot_general(x, y, (((1,), (2,)), batch), preferred_element_type=jax.numpy.float32)

    got = np.asarray(xfuse.jit(fn, backend="jax", backend_options={"mode": mode})(a, b))
    spec = "bkf,gbk->bfg" if batched else "akf,gbk->afgb"
    want = np.einsum(spec, a.astype(np.float64), b.astype(np.float64))
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if batched:  # what the backend works around (XLA:GPU has the dot; seen on an H200)
        with pytest.raises(Exception, match="UNIMPLEMENTED"), jax.default_device(jax.devices("cpu")[0]):
            jax.block_until_ready(jax.jit(fn)(a, b))
