"""Library steps (`xfuse.runtime.library`): the data ops as numpy calls agree bit for bit with
the reference interpreter's references on random modules and at the edges (NaN, signed zeros,
bf16 and f16, out-of-bounds and duplicate indices); a library step in a program gets buffers of
its own (never an input's), packs several outputs into one tuple, leaves its inputs as they
were; an AOT artifact holding them runs where jax and numba cannot be imported, and the C
entry (emit_c) refuses them naming the step."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import xfuse
from benchmarks.aot import BLOCKER
from xfuse.backends.numba.library_steps import LIBRARY_OPS, library_step
from xfuse.hlo import Instruction, Op, Shape, TupleShape
from xfuse.runtime import Executable
from xfuse.runtime.library import FUNCTIONS
from xfuse.runtime.program import build

from ..fusion.helpers import same_values
from ..hlo.strategies import modules_with_inputs

AROUND = (Op.CONVERT_ELEMENT_TYPE, Op.GET_TUPLE_ELEMENT, Op.NEG)


def library_of(inst: Instruction, operands: list[np.ndarray]) -> object:
    """`inst` through a library step's function, with the step's JSON attributes."""
    step = library_step(inst, {"name": inst.name, "inputs": [], "outputs": [0]})
    with np.errstate(all="ignore"):
        results = FUNCTIONS[step["fn"]]([np.asarray(o) for o in operands], step["attrs"])
    shapes = inst.shape.elements if isinstance(inst.shape, TupleShape) else (inst.shape,)
    results = [np.asarray(r).astype(s.dtype.numpy).reshape(s.dims) for r, s in zip(results, shapes)]
    return tuple(results) if isinstance(inst.shape, TupleShape) else results[0]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=modules_with_inputs(max_ops=6, calls=False, ops=tuple(LIBRARY_OPS) + AROUND))
def test_library_functions_match_the_references_on_random_modules(drawn):
    module, args = drawn
    comp = module.entry_computation
    values: dict[str, object] = {}
    params = {p.name: p.attr("index") for p in comp.parameters}
    for inst in comp.instructions:
        operands = [values[o] for o in inst.operands]
        if inst.op is Op.PARAMETER:
            values[inst.name] = args[params[inst.name]]
            continue
        with np.errstate(all="ignore"):
            want = inst.info.ref(operands, inst.attributes, inst.shape)
        if isinstance(inst.shape, Shape):
            want = np.asarray(want, inst.shape.dtype.numpy).reshape(inst.shape.dims)
        if inst.op in LIBRARY_OPS:
            got = library_of(inst, operands)
            assert same_values(got, want), f"{inst.name} ({inst.op}) differs from its reference"
        values[inst.name] = want


def edge(dtype) -> np.ndarray:
    values = [0.0, -0.0, math.nan, -math.nan, 1.0, -1.0, math.inf, -math.inf, 2.5, 1.0, -0.0]
    return np.array(values, np.float64).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_edge_values_through_the_jit_path_match_jax(dtype):
    x = edge(dtype).reshape(1, -1)

    def f(x):
        return (jnp.sort(x, axis=1), jnp.argsort(x, axis=1), jax.lax.top_k(x, 5), jax.lax.cummax(x, 1),
                jax.lax.cummin(x, 1, reverse=True), x.at[0, jnp.array([1, 1, 40, -1])].add(x[0, :4]))

    want = jax.jit(f)(x)
    for backend in ("numba", "c"):
        got = xfuse.jit(f, backend=backend)(x)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert same_values(np.asarray(g), np.asarray(w)), (backend, g, w)


def test_a_library_step_gets_its_own_buffers_and_packs_several_outputs():
    keys = np.array([3, 1, 2, 1], np.int32)
    values = np.array([0.5, -0.0, 2.0, 0.0], np.float32)
    sort = {"op": "library", "name": "sort.0", "fn": "sort", "label": "sort", "inputs": [0, 1], "outputs": [2],
            "attrs": {"dimension": 0, "is_stable": True, "num_keys": 1},
            "specs": [[[4], "int32"], [[4], "float32"]]}
    element = {"op": "alias", "kind": "element", "index": 1, "name": "gte", "inputs": [2], "outputs": [3]}
    scatter = {"op": "library", "name": "scatter.1", "fn": "scatter", "label": "scatter", "inputs": [3, 4, 3],
               "outputs": [5], "specs": [[[4], "float32"]],
               "attrs": {"update_window_dims": [], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
                         "operand_batching_dims": [], "scatter_indices_batching_dims": [],
                         "mode": "fill_or_drop", "combine": "add"}}
    program = {"params": [0, 1], "results": [2, 5], "n_values": 6, "constants": {"4": "c0"},
               "param_specs": [[[4], "int32"], [[4], "float32"]], "steps": [sort, element, scatter]}
    indices = np.array([[0], [0], [9], [3]], np.int32)
    executable = build(program, {}, {"c0": indices})
    assert isinstance(executable, Executable) and not executable.plan.in_place
    before = values.copy()
    (sorted_keys, sorted_values), scattered = executable([keys, values])
    assert sorted_keys.tolist() == [1, 1, 2, 3]
    assert [float(v) for v in sorted_values] == [-0.0, 0.0, 2.0, 0.5] and np.signbit(sorted_values[0])
    assert scattered.tolist() == [-0.0 + -0.0 + 0.0, 0.0, 2.0, 0.5 + 0.5]
    assert same_values(values, before)  # inputs are read, never written


def test_an_unknown_library_function_names_the_step():
    step = {"op": "library", "name": "fft.0", "fn": "fft", "label": "fft", "inputs": [0], "outputs": [1],
            "attrs": {}, "specs": [[[4], "float32"]]}
    program = {"params": [0], "results": [1], "n_values": 2, "constants": {}, "param_specs": [[[4], "float32"]],
               "steps": [step]}
    with pytest.raises(ValueError, match="step 'fft.0': no library function 'fft'"):
        build(program, {}, {})


def embed_and_sort(table, ids, logits):
    rows = table[ids]
    grad = jax.grad(lambda t: jnp.sum(jnp.tanh(t[ids])))(table)
    values, indices = jax.lax.top_k(logits, 3)
    return rows * 2.0, grad, jnp.sort(logits, axis=-1), values, indices, jnp.cumsum(logits, axis=1)


def artifact_inputs():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    ids = np.array([[1, 9, 1], [0, 12, -3]], np.int32)
    logits = rng.standard_normal((2, 8)).astype(np.float32)
    logits[0, 2], logits[1, 5] = np.nan, -0.0
    return table, ids, logits


def test_an_artifact_with_gather_sort_and_scatter_runs_with_numpy_alone(tmp_path):
    args = artifact_inputs()
    compiled = xfuse.jit(embed_and_sort).lower(*args).compile()
    path = compiled.save(tmp_path / "data.xfa")
    want = compiled(*args)
    np.savez(tmp_path / "in.npz", *args)
    code = BLOCKER + textwrap.dedent(f"""
        import sys
        import numpy as np
        import xfuse.aot
        f = xfuse.aot.load({str(path)!r})
        d = np.load({str(tmp_path / 'in.npz')!r})
        out = f(d["arr_0"], d["arr_1"], d["arr_2"])
        np.savez({str(tmp_path / 'out.npz')!r}, *out)
        print("imported:", [m for m in ("jax", "jaxlib", "numba", "llvmlite") if m in sys.modules])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "imported: []" in done.stdout
    with np.load(tmp_path / "out.npz") as out:
        got = [out[f"arr_{i}"] for i in range(len(want))]
    for g, w in zip(got, want):
        assert same_values(g, np.asarray(w))
    reference = jax.jit(embed_and_sort)(*args)
    np.testing.assert_array_equal(got[4], np.asarray(reference[4]))
    np.testing.assert_allclose(got[1], np.asarray(reference[1]), rtol=2e-5)  # tanh's ulps


def test_the_c_entry_refuses_a_library_step_naming_it(tmp_path):
    from xfuse.aot import emit_c

    compiled = xfuse.jit(lambda x: jnp.sort(x) * 2).lower(np.ones(8, np.float32)).compile()
    with pytest.raises(ValueError, match=r"step 'sort\.\d+' \(sort\) is a numpy library call; the C entry has no"):
        emit_c(compiled, tmp_path / "out", "sorter")
    assert not (tmp_path / "out").exists()
