"""`xfuse.aot.emit_c`: the C library and header of a compiled function, driven by a C program.

Each case emits C, builds a small main.c against the header (it checks the header's macros
against the accessor functions, prints the metadata, reads the inputs from a file, calls
`<name>_run` once, then from two threads at once, and writes the outputs), runs it with two
OpenMP threads and compares with the compiled function. Programs the C entry cannot run are
refused with a ValueError before anything is written.
"""

from __future__ import annotations

import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.aot import emit_c
from xfuse.backends.c import toolchain

MAIN = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.h"

static const void *inputs[MODEL_NUM_INPUTS + 1];
static void *outputs[3][MODEL_NUM_OUTPUTS + 1];

static void *call(void *which) {
    return (void *)(intptr_t)model_run(inputs, outputs[(intptr_t)which]);
}

int main(int argc, char **argv) {
    if (argc != 3 || model_num_inputs() != MODEL_NUM_INPUTS || model_num_outputs() != MODEL_NUM_OUTPUTS)
        return 10;
    FILE *f = fopen(argv[1], "rb");
    for (int i = 0; i < MODEL_NUM_INPUTS; i++) {
        int64_t n = model_input_bytes(i);
        void *p = malloc(n ? n : 1);
        if (!f || fread(p, 1, n, f) != (size_t)n) return 11;
        inputs[i] = p;
        printf("input %d %s %s %lld:", i, model_input_name(i), model_input_dtype(i),
               (long long)model_input_size(i));
        for (int r = 0; r < model_input_rank(i); r++) printf(" %lld", (long long)model_input_dims(i)[r]);
        printf("\n");
    }
    fclose(f);
    for (int j = 0; j < MODEL_NUM_OUTPUTS; j++) {
        int64_t n = model_output_bytes(j);
        for (int c = 0; c < 3; c++) {
            outputs[c][j] = malloc(n ? n : 1);
            memset(outputs[c][j], 0xA5, n);  /* every byte must be written */
        }
        printf("output %d %s %s %lld:", j, model_output_name(j), model_output_dtype(j),
               (long long)model_output_size(j));
        for (int r = 0; r < model_output_rank(j); r++) printf(" %lld", (long long)model_output_dims(j)[r]);
        printf("\n");
    }
    if (model_input_rank(-1) != -1 || model_output_dims(MODEL_NUM_OUTPUTS) != NULL) return 12;
    if (model_run(inputs, outputs[0])) return 13;
    pthread_t threads[2];  /* two calls at once: no shared state */
    for (intptr_t t = 0; t < 2; t++) pthread_create(&threads[t], NULL, call, (void *)(t + 1));
    for (int t = 0; t < 2; t++) {
        void *status;
        pthread_join(threads[t], &status);
        if (status) return 14;
    }
    f = fopen(argv[2], "wb");
    for (int j = 0; j < MODEL_NUM_OUTPUTS; j++) {
        int64_t n = model_output_bytes(j);
        for (int c = 1; c < 3; c++)
            if (memcmp(outputs[0][j], outputs[c][j], n)) return 15;
        fwrite(outputs[0][j], 1, n, f);
    }
    fclose(f);
    return 0;
}
"""

rng = np.random.default_rng(0)


def normal(*dims, dtype=np.float32):
    return rng.standard_normal(dims).astype(dtype)


def layer_norm(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * g + b


W = normal(128, 32)

DOT = {"rtol": 1e-4, "atol": 1e-5}


def layers(x, w1, b1, w2):
    h = jax.nn.relu(x @ w1 + b1)
    return (h @ w2).sum(-1), jnp.tanh(h) * 2.0


# name -> (function, arguments, tolerance (dots: any summation order), jit options)
CASES = {
    "mlp": (lambda x, w, b: jax.nn.softmax(jax.nn.relu(x @ w + b), -1),
            (normal(64, 512), normal(512, 1024) / 16, normal(1024)), DOT, {}),
    "layer_norm": (layer_norm, (normal(64, 256) * 3 + 1, normal(256), normal(256)), {}, {}),
    "activations": (lambda x: jax.nn.sigmoid(jnp.tanh(x) * 2.0 + 1.0) * jnp.tanh(x - 0.5),
                    (normal(512, 512),), {}, {}),  # work past PARALLEL_MIN_WORK: split over threads
    "two_outputs": (lambda x, y: (jnp.tanh(x @ W) + 1.0, (x - y).sum(-1)),
                    (normal(16, 128), normal(16, 128)), DOT, {}),
    "batched": (lambda a, b: jnp.exp(jnp.einsum("bij,bjk->bik", a, b) / 8),
                (normal(4, 32, 64), normal(4, 64, 48)), DOT, {}),
    # temporaries in the arena, an output fusion's dot in scratch (two outputs), and a dot
    # reading a tuple element
    "layers": (layers, (normal(32, 64), normal(64, 48), normal(48), normal(48, 40)), DOT, {}),
    # unfused: broadcast constants, kernels writing over a dying input (the planner's in_place)
    "unfused": (lambda x: jnp.tanh(jnp.exp(x * 2.0) + 1.0) * 3.0, (normal(1024),), {}, {"passes": "none"}),
    # the GEMM's other shapes: b transposed (n strided), free axes apart (offset
    # tables), integers (a dot result returned and read again), vectors (rank 0)
    "transposed": (lambda a, b: jnp.einsum("ik,jk->ij", a, b), (normal(33, 70), normal(45, 70)), DOT, {}),
    "strided": (lambda a, b: jnp.einsum("ibjc,jbk->bick", a, b), (normal(3, 2, 4, 5), normal(4, 2, 6)), DOT, {}),
    "integers": (lambda a, b: (a @ b, (a @ b).sum()),
                 (rng.integers(-9, 9, (12, 20)).astype(np.int32), rng.integers(-9, 9, (20, 7)).astype(np.int32)),
                 {}, {}),
    "vectors": (lambda a, b: jnp.dot(a, b), (normal(300), normal(300)), DOT, {}),
    # a scan fusion: the time loop inside one kernel, its blocks split over threads
    "scan": (lambda h, xs: jax.lax.scan(lambda c, x: (jnp.tanh(c * 0.9 + x), c - x), h, xs),
             (normal(1100), normal(500, 1100)), {}, {}),
    # results that are an argument or a constant are copied out
    "passthrough": (lambda x: (x, x + 1.0, jnp.float32(2.5)), (normal(3, 5),), {}, {}),
    # a lone broadcast: a numpy step in programs, a kernel in the C entry (no library calls)
    "broadcast": (lambda x, y: (jnp.broadcast_to(x, (4, 3, 5)), y * 2.0), (normal(3, 5), normal(7)), {}, {}),
    # loops as C drivers: a scanned RNN (a dot in the body, the stack written a window at a
    # time in place) and a loop whose trip count depends on the data, whose state is returned
    "rnn": (lambda xs, wx, wh, b: jax.lax.scan(lambda h, x: (jnp.tanh(x @ wx + h @ wh + b),) * 2,
                                               jnp.zeros((4, 24), jnp.float32), xs),
            (normal(9, 4, 16), normal(16, 24) / 4, normal(24, 24) / 5, normal(24)), DOT, {}),
    "while": (lambda x: jax.lax.while_loop(lambda c: c[1].sum() < 1e4, lambda c: (c[0] + 1, c[1] * 1.5 + 1.0),
                                           (0, x)), (np.abs(normal(6)),), {}, {}),
}
# what each case is there for, as it shows in the generated C
SHOWS = {
    "activations": "#pragma omp parallel reduction",
    "mlp": "#pragma omp parallel for collapse(3)",
    "layers": "(xf_arena + 6144)",
    "transposed": "to[n] = from[n * 70];",
    "strided": "xf_offsets(xf_am, 2, xf_am_dims, xf_am_strides);",
    "integers": "k_reduce_sum_2(0, 1, (int32_t *)outputs[0], (int32_t *)outputs[1])",
    "passthrough": "memmove(outputs[2], xf_const_c0, 4);",
    "scan": "for (int64_t t = 0; t < 500; ++t) {",
    "rnn": "if (rnn_loop_3(xf_init, xf_final)) goto done;",
    "while": "if (while_loop_0(xf_init, xf_final)) goto done;",
}


def build_main(folder, name: str, openmp: bool = True):
    (folder / "main.c").write_text(MAIN.replace("model", name).replace("MODEL", name.upper()))
    command = [*toolchain.compiler(), "-std=gnu11", "-O1", "-pthread", f"-I{folder}", str(folder / "main.c"),
               "-o", str(folder / "main"), f"-L{folder}", f"-l{name}", f"-Wl,-rpath,{folder}"]
    if openmp and toolchain.openmp_available():
        command.append("-fopenmp")
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return folder / "main"


def run_main(program, args) -> str:
    folder = program.parent
    with open(folder / "inputs.bin", "wb") as f:
        for a in args:
            f.write(np.ascontiguousarray(a).tobytes())
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    result = subprocess.run([str(program), str(folder / "inputs.bin"), str(folder / "outputs.bin")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, f"main exited with {result.returncode}: {result.stderr}"
    return result.stdout


def read_outputs(path, expected: list[np.ndarray]) -> list[np.ndarray]:
    data = path.read_bytes()
    assert len(data) == sum(e.nbytes for e in expected)
    out, at = [], 0
    for e in expected:
        out.append(np.frombuffer(data[at : at + e.nbytes], e.dtype).reshape(e.shape))
        at += e.nbytes
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_emitted_library_matches_the_compiled_function(case, tmp_path):
    fn, args, tolerance, options = CASES[case]
    compiled = xfuse.jit(fn, **options).lower(*args).compile()
    paths = emit_c(compiled, tmp_path, case)
    assert paths == {"source": tmp_path / f"{case}.c", "header": tmp_path / f"{case}.h",
                     "library": tmp_path / f"lib{case}.so"}
    assert all(p.is_file() for p in paths.values())
    header = paths["header"].read_text()
    assert f"int {case}_run(const void *const *inputs, void *const *outputs);" in header
    assert 'extern "C"' in header
    assert SHOWS.get(case, "") in paths["source"].read_text()
    if case == "unfused":  # C kernels write over an input that dies (numba kernels do not)
        assert xfuse.jit(fn, backend="c", **options).lower(*args).compile().executable.plan.in_place

    stdout = run_main(build_main(tmp_path, case), args)
    expected = [np.asarray(e) for e in jax.tree_util.tree_leaves(compiled(*args))]
    lines = stdout.splitlines()
    for i, a in enumerate(args):
        dims = "".join(f" {d}" for d in a.shape)
        assert lines[i].startswith(f"input {i} "), lines[i]
        assert lines[i].endswith(f"{a.dtype.name} {a.size}:{dims}"), lines[i]
    for j, e in enumerate(expected):
        dims = "".join(f" {d}" for d in e.shape)
        line = lines[len(args) + j]
        assert line.startswith(f"output {j} result") and line.endswith(f"{e.dtype.name} {e.size}:{dims}"), line
    got = read_outputs(tmp_path / "outputs.bin", expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, **{"rtol": 1e-5, "atol": 1e-6, **tolerance})


def test_header_names_arguments_and_kernels_stay_private(tmp_path):
    x, w, b = CASES["mlp"][1]
    compiled = xfuse.jit(lambda x, w, b: jax.nn.relu(x @ w + b)).lower(x, w, b).compile()
    paths = emit_c(compiled, tmp_path, "dense", openmp=False)
    header = paths["header"].read_text()
    for text in ("inputs[0]  x: float32[64,512]", "inputs[1]  w: float32[512,1024]", "inputs[2]  b: float32[1024]",
                 "outputs[0]  result: float32[64,1024]", "#define DENSE_INPUT1_SIZE 524288",
                 "#define DENSE_OUTPUT0_BYTES 262144", "#define DENSE_NUM_INPUTS 3"):
        assert text in header, text
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(paths["library"])], capture_output=True, text=True)
    if symbols.returncode == 0:
        exported = {line.split()[-1] for line in symbols.stdout.splitlines() if line.split()}
        assert "dense_run" in exported and "dense_input_dims" in exported
        assert not any(s.startswith("k_") for s in exported), exported
    got = run_main(build_main(tmp_path, "dense", openmp=False), (x, w, b))
    assert "input 0 x float32" in got
    (result,) = read_outputs(tmp_path / "outputs.bin", [np.asarray(compiled(x, w, b))])
    np.testing.assert_allclose(result, compiled(x, w, b), **DOT)


def test_bfloat16_is_refused_before_anything_is_written(tmp_path):
    x = jnp.ones((8, 16), jnp.bfloat16)
    compiled = xfuse.jit(lambda x: jnp.tanh(x) * 2).lower(x).compile()
    with pytest.raises(ValueError, match=r"step 'fusion\.0'.*bfloat16.*f16/bf16"):
        emit_c(compiled, tmp_path / "out", "bf")
    assert not (tmp_path / "out").exists()


def test_a_name_must_be_a_c_identifier_and_the_target_known(tmp_path):
    compiled = xfuse.jit(lambda x: x * 2).lower(np.ones(4, np.float32)).compile()
    with pytest.raises(ValueError, match="not a C identifier"):
        emit_c(compiled, tmp_path / "a", "my-model")
    with pytest.raises(ValueError, match="target='pentium' is not known"):
        emit_c(compiled, tmp_path / "b", "model", target="pentium")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_nested_program_is_refused_naming_its_step():
    from xfuse.aot.emit import generate
    from xfuse.backends.numba.lowering import Lowered

    inner = {"params": [0], "results": [0], "n_values": 1, "steps": [], "constants": {},
             "param_specs": [[[4], "float32"]]}
    program = {"params": [0], "results": [1], "n_values": 2, "constants": {}, "param_specs": [[[4], "float32"]],
               "steps": [{"op": "nested", "name": "fusion.3", "label": "nested fusion fused_tuple",
                          "inputs": [0], "outputs": [1], "program": inner, "tupled": False}]}
    with pytest.raises(ValueError, match=r"step 'fusion\.3' \(nested fusion fused_tuple\).*no nested programs"):
        generate(Lowered(program), "nested")


GEMMS = {  # name -> (function, arguments): whole tiles, rows and columns left over, a batch
    "rnn_step": (lambda h, w: h @ w, (normal(16, 256), normal(256, 256))),
    "ragged": (lambda a, b: a @ b, (normal(13, 37), normal(37, 50))),
    "one_tile": (lambda a, b: a @ b, (normal(6, 5), normal(5, 16))),
    "batched": (lambda a, b: jnp.einsum("bij,bjk->bik", a, b), (normal(3, 7, 9), normal(3, 9, 33))),
    "special": (lambda a, b: a @ b, (np.where(rng.random((8, 12)) < 0.1, np.float32(np.inf), normal(8, 12)),
                                     np.where(rng.random((12, 20)) < 0.1, np.float32(np.nan),
                                              np.where(rng.random((12, 20)) < 0.1, np.float32(-0.0),
                                                       normal(12, 20))))),
    "float64": (lambda a, b: a @ b, (rng.standard_normal((11, 17)), rng.standard_normal((17, 21)))),
}


@pytest.mark.parametrize("case", list(GEMMS))
def test_avx2_gemm_tiles_sum_as_the_portable_loops_bit_for_bit(case, tmp_path):
    """The AVX2 tiles (built where the target has AVX2 and FMA) against the same GEMM built
    without them: each sum is fused multiply-adds in the order of k in both, so every
    element, NaN, infinities and -0.0 included, is the same."""
    import ctypes

    from xfuse.aot.emit import generate
    from xfuse.backends.numba.lowering import lower

    fn, args = GEMMS[case]
    with jax.enable_x64(args[0].dtype == np.float64):
        compiled = xfuse.jit(fn).lower(*args).compile()
        want = np.asarray(jax.jit(fn)(*args))
    source, _ = generate(lower(compiled.module), case, openmp=False)
    assert "#ifdef XF_GEMM_AVX2" in source
    results = []
    for variant, extra in (("tiles", ()), ("portable", ("-DXF_NO_GEMM_AVX2",))):
        path = tmp_path / f"lib{case}_{variant}.so"
        toolchain.compile_shared(source, path, extra=extra, name=case)
        run = getattr(ctypes.CDLL(str(path)), f"{case}_run")
        out = np.empty(want.shape, want.dtype)
        inputs = (ctypes.c_void_p * 2)(*[np.ascontiguousarray(a).ctypes.data for a in args])
        assert run(inputs, (ctypes.c_void_p * 1)(out.ctypes.data)) == 0
        results.append(out)
    np.testing.assert_array_equal(results[0].view(np.uint8), results[1].view(np.uint8))
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-4)
