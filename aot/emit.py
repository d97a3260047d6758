"""tfcompile's C interface: `emit_c` writes a compiled function as a C file, its header and a
shared library whose entry `int <name>_run(const void *const *inputs, void *const *outputs)`
runs the program's steps (the header documents the API). Temporaries live in one arena per
call laid out by the runtime's planner (no state: calls may run at once); kernels are the C
backend's, made static; kernel rows and GEMM tiles are split across OpenMP threads; every dot
is a register-tiled C GEMM generated from `runtime.products.dot_plan` (the dot of an output
fusion computed whole before its epilogue, not in row blocks). A while loop runs as a C loop
driver (`aot/loop.py`, whose condition and body are written by this module's `_Entry` too).
f16/bf16 and complex values, nested programs, branches and loops no driver runs are refused
with a ValueError naming the step, before anything is written.
Imports numpy, the C backend and the numba backend's lowering; jax only for result names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from xfuse.backends.c import render, toolchain
from xfuse.backends.c.backend import kernel_texts
from xfuse.backends.numba.lowering import Lowered, lower
from xfuse.hlo import Op
from xfuse.runtime.plan import ALIGN
from xfuse.runtime.program import Kernel, build, walk

from .gemm import ITEMSIZE, _ctype, gemm
from .interface import Port, header, metadata

ENTRY_PRELUDE = r"""
/* ---------------------------------------------------------------- the entry function */
#ifndef XF_ENTRY_PRELUDE  /* once per file: each module's loop drivers bring it along */
#define XF_ENTRY_PRELUDE
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#define XF_THREAD ((int64_t)omp_get_thread_num())
#define XF_THREADS ((int64_t)omp_get_num_threads())
#else
#define XF_THREAD ((int64_t)0)
#define XF_THREADS ((int64_t)1)
#endif
#define XF_API __attribute__((visibility("default")))
#if defined(__AVX2__) && defined(__FMA__) && !defined(XF_NO_GEMM_AVX2)
#include <immintrin.h>
#define XF_GEMM_AVX2 1  /* GEMM tiles in AVX2 vectors (aot/gemm.py) */
#endif

/* table[i]: the offset of the i-th index (row-major over `rank` axes) of an index group. */
static inline void xf_offsets(int64_t *table, int rank, const int64_t *dims, const int64_t *strides) {
    int64_t n = 1;
    for (int r = 0; r < rank; r++) n *= dims[r];
    for (int64_t i = 0; i < n; i++) {
        int64_t rest = i, offset = 0;
        for (int r = rank - 1; r >= 0; r--) {
            offset += (rest % dims[r]) * strides[r];
            rest /= dims[r];
        }
        table[i] = offset;
    }
}
#endif  /* XF_ENTRY_PRELUDE */
"""


@dataclass(frozen=True)
class Leaf:
    """An array value of the program: the buffer it lives in (`("param", i)`, `("const", key)`
    or `(step, k)`), its dims and dtype. A tuple value is a Python tuple of values."""

    key: tuple
    dims: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) if self.dims else 1

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


def without_callbacks(module, what: str) -> None:
    """Raises ValueError naming the first host callback of `module`: an artifact runs without
    Python's objects, and a callback is one."""
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.op is Op.CALLBACK:
                at = f" at {inst.loc}" if inst.loc else ""
                raise ValueError(f"{what}: {inst.name}{at} calls a Python function (jax.pure_callback, "
                                 "equinox.error_if), which an AOT artifact cannot hold")


def emit_c(compiled, out_dir: str | Path, name: str | None = None, *, target: str = "native",
           openmp: bool = True) -> dict[str, Path]:
    """Writes `<name>.c`, `<name>.h` and `lib<name>.so` (built for `target`, with OpenMP when
    `openmp` and the compiler has it) into `out_dir`; returns their paths as {"source",
    "header", "library"}. The source builds with or without OpenMP."""
    openmp = openmp and toolchain.openmp_available()
    name = _identifier(name if name is not None else compiled.module.name, given=name is not None)
    toolchain.target_flags(target)  # an unknown target fails here, before anything is written
    without_callbacks(compiled.module, "emit_c")
    lowered = lower(compiled.module, fills=False)  # the entry makes no numpy library calls
    input_names = [leaf.path for leaf in compiled.lowered.info.leaves]
    source, header = generate(lowered, name, input_names, _result_names(compiled, lowered), openmp=openmp)
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"source": folder / f"{name}.c", "header": folder / f"{name}.h",
             "library": folder / f"lib{name}.so"}
    paths["source"].write_text(source)
    paths["header"].write_text(header)
    toolchain.compile_shared(source, paths["library"], target, openmp=openmp, name=name)
    return paths


def _identifier(name: str, given: bool) -> str:
    if given:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"emit_c: name={name!r} is not a C identifier")
        return name
    name = re.sub(r"\W", "_", name)
    return name if re.match(r"[A-Za-z_]", name) else f"f_{name}"


def _result_names(compiled, lowered: Lowered) -> list[str]:
    """The flat results' paths in the output tree: `result`, `result[0]`, `result['y']`."""
    import jax

    tree = compiled.lowered.out_tree
    count = len(lowered.program["results"])
    names = [f"result[{j}]" for j in range(count)]
    if tree.num_leaves == count:
        skeleton = jax.tree_util.tree_unflatten(tree, list(range(count)))
        for path, j in jax.tree_util.tree_flatten_with_path(skeleton)[0]:
            names[j] = "result" + jax.tree_util.keystr(path)
    return names


# ---------------------------------------------------------------------------- generation
def generate(lowered: Lowered, name: str, input_names: list[str] | None = None,
             output_names: list[str] | None = None, *, openmp: bool = True) -> tuple[str, str]:
    """(C source, header) of a lowered module; ValueError when the C entry cannot run it.
    The names (paths in the Python signature) go into the header and the `_name` accessors."""
    entry = _Entry(lowered, name, openmp)
    body = entry.body()
    program = lowered.program
    inputs = [entry.values[slot] for slot in program["params"]]
    outputs = [entry.values[slot] for slot in program["results"]]
    input_names = input_names or [f"args[{i}]" for i in range(len(inputs))]
    output_names = output_names or [f"result[{j}]" for j in range(len(outputs))]
    if len(input_names) != len(inputs) or len(output_names) != len(outputs):
        raise ValueError(f"emit_c: {len(input_names)} argument and {len(output_names)} result names "
                         f"for a program of {len(inputs)} arguments and {len(outputs)} results")
    inputs = [Port(n, v.dims, v.dtype) for n, v in zip(input_names, inputs)]
    outputs = [Port(n, v.dims, v.dtype) for n, v in zip(output_names, outputs)]
    try:
        kernels = list(kernel_texts(lowered).values())
    except NotImplementedError as e:
        raise ValueError(f"emit_c: {e}") from None
    parts = [f"/* Generated by xfuse: {name}, {len(kernels)} fused kernels and the entry "
             f"function {name}_run (the interface is {name}.h). */",
             render.header_text(), render.PRELUDE,
             "/* Kernels are internal to this library: only the entry function is exported. */",
             "#undef XF_EXPORT", "#define XF_EXPORT static", "#define XF_NO_OBJECT_ENTRIES", *kernels, ENTRY_PRELUDE,
             *entry.constants, *entry.dots, metadata(name, inputs, outputs), body]
    return "\n".join(parts) + "\n", header(name, inputs, outputs)


@dataclass
class Shared:
    """What the functions of one C file share: the static arrays of constants (by C name,
    `<constant_prefix><key>`) and a GEMM function per dot, named from `prefix`."""

    prefix: str
    constant_prefix: str = "xf_const_"
    constants: dict[str, str] = field(default_factory=dict)
    dots: list[str] = field(default_factory=list)


class _Entry:
    """The entry function of one program: values tracked at generation time, buffers placed by
    the runtime's planner, each step as C. `loop_body`: the program is a while loop's body
    (`aot/loop.py`): a kernel step with a `window` writes its target input in place, and a
    result that is its own parameter (state passed along, or written by a window) is kept
    there, with no output."""

    def __init__(self, lowered: Lowered, name: str, openmp: bool, shared: Shared | None = None,
                 loop_body: bool = False) -> None:
        self.lowered, self.name, self.openmp, self.loop_body = lowered, name, openmp, loop_body
        self.program = lowered.program
        self.shared = shared if shared is not None else Shared(name)
        self.windows: dict[int, int] = {}  # step -> the parameter it writes in place
        self.parts: dict[int, tuple[_Entry, str]] = {}  # window step -> its parts' function
        self.functions: list[str] = []  # static functions the entry calls (loops, window parts)
        self.loops: dict[int, tuple[list[str], str]] = {}  # while step -> (state kinds, driver)
        self.values = self.trace()
        self.kept = {j for j, slot in enumerate(self.program["results"])
                     if loop_body and getattr(self.values[slot], "key", None) == ("param", j)}
        self.place(self.values)

    @property
    def constants(self) -> list[str]:
        return list(self.shared.constants.values())

    @property
    def dots(self) -> list[str]:
        return self.shared.dots

    # ------------------------------------------------------------------ values
    def trace(self) -> list:
        """Every value slot's Leaf (or tuple of values), checking what the C entry can run."""
        program = self.program
        values: list = [None] * program["n_values"]
        for i, (slot, spec) in enumerate(zip(program["params"], program["param_specs"])):
            if spec is None:
                raise ValueError(f"emit_c: argument {i} is a tuple; the C entry takes arrays only")
            values[slot] = Leaf(("param", i), tuple(spec[0]), spec[1])
        for slot, key in program["constants"].items():
            array = self.lowered.constants[key]
            values[int(slot)] = Leaf(("const", key), tuple(array.shape), array.dtype.name)
            _check_dtypes(f"emit_c: constant {key} (value {slot})", [values[int(slot)]])
        for i, step in enumerate(program["steps"]):
            what = f"emit_c: step {step['name']!r}"
            ins = [values[v] for v in step["inputs"]]
            op = step["op"]
            if op == "alias":
                out = self._alias(step, ins, what)
            elif op == "dot":
                _check_dtypes(what, [*ins, Leaf((), (), step["dtype"])])
                out = Leaf((i, 0), tuple(step["dims"]), step["dtype"])
            elif op == "kernel" and "window" in step and self.loop_body:
                out = [self._window(i, step, ins, what)]
            elif op == "kernel":
                out = self._kernel(i, step, ins, what)
            elif op == "nested":
                raise ValueError(f"{what} ({step.get('label', 'a nested fusion')}) runs as a nested "
                                 "program of its own; the C entry has no nested programs")
            elif op == "while" and not self.loop_body:
                out = self._loop(i, step, ins, what)
            elif op in ("while", "conditional"):
                raise ValueError(f"{what} ({step['label']}) is control flow, which the runtime runs; "
                                 "the C entry has no branches or loops inside loops (save the "
                                 "function as an artifact with compiled.save instead)")
            elif op == "library":
                raise ValueError(f"{what} ({step['label']}) is a numpy library call; the C entry has "
                                 "no library calls (run the artifact with xfuse.aot.load instead)")
            else:
                raise ValueError(f"{what}: unknown step kind {op!r}")
            if isinstance(out, list):
                for slot, value in zip(step["outputs"], out):
                    values[slot] = value
            else:
                values[step["outputs"][0]] = out
        for i, slot in enumerate(program["params"]):
            _check_dtypes(f"emit_c: argument {i}", [values[slot]])
        for j, slot in enumerate(program["results"]):
            if not isinstance(values[slot], Leaf):
                raise ValueError(f"emit_c: result {j} is a tuple; the C entry returns arrays only")
            _check_dtypes(f"emit_c: result {j}", [values[slot]])
        return values

    @staticmethod
    def _alias(step: dict, ins: list, what: str):
        kind = step["kind"]
        if kind in ("tuple", "barrier"):
            return tuple(ins)
        if kind == "element":
            if not isinstance(ins[0], tuple):
                raise ValueError(f"{what}: tuple element {step['index']} of an array")
            return ins[0][step["index"]]
        if kind == "reshape":
            if not isinstance(ins[0], Leaf):
                raise ValueError(f"{what}: a reshape of a tuple")
            return Leaf(ins[0].key, tuple(step["dims"]), ins[0].dtype)
        raise ValueError(f"{what}: unknown alias kind {kind!r}")

    def _loop(self, i: int, step: dict, ins: list, what: str) -> tuple:
        """The loop's final state: a value passed along unchanged is its input; any other
        element gets a buffer of its own. The loop runs as a C driver (`aot/loop.py`)."""
        from .loop import driver  # which builds on this module

        name = f"{self.shared.prefix}_loop_{i}"
        try:
            text, kinds = driver(self.lowered, step, name, self.shared)
        except ValueError as e:
            raise ValueError(f"{what} ({step['label']}) is a loop the C entry cannot run: {e} "
                             "(save the function as an artifact with compiled.save instead)") from None
        self.functions.append(text)
        self.loops[i] = (kinds, name)
        return tuple(ins[k] if kind == "pass" else Leaf((i, k), tuple(dims), dtype)
                     for k, (kind, (dims, dtype)) in enumerate(zip(kinds, step["body"]["param_specs"])))

    def _window(self, i: int, step: dict, ins: list, what: str) -> Leaf:
        """The target input, which the step writes in place. Parts computed by kernels of
        their own (the update, the starts) run as a function of their own into the arena."""
        window, target = step["window"], step["window"]["target"]
        if window["parts"]["steps"]:
            parts = _Entry(replace(self.lowered, program=window["parts"]), self.name, self.openmp, self.shared)
            self.parts[i] = (parts, f"{self.name}_window_{i}")
        leaf = ins[target]
        if not (isinstance(leaf, Leaf) and leaf.key[0] == "param"):
            raise ValueError(f"{what} ({step['label']}): a window into a value that is no loop state")
        _check_dtypes(f"{what} ({step['label']})", [leaf])
        self.windows[i] = leaf.key[1]
        return leaf

    @staticmethod
    def _kernel(i: int, step: dict, ins: list, what: str):
        if len(ins) != len(step["params"]) or not all(isinstance(v, Leaf) for v in ins):
            raise ValueError(f"{what}: its {len(ins)} inputs do not match the kernel's "
                             f"{len(step['params'])} array parameters")
        specs = [Leaf((i, k), tuple(dims), dtype) for k, (dims, dtype) in enumerate(step["specs"])]
        _check_dtypes(f"{what} ({step['label']})",
                      [*specs, *(Leaf((), tuple(d), t) for d, t in step["params"])])
        if step.get("dot") is not None:
            _check_dtypes(f"{what} ({step['label']}): its dot", [Leaf((), (), step["dot"]["dtype"])])
        if len(step["outputs"]) == 1 and len(specs) > 1:
            return tuple(specs)
        return specs

    # ------------------------------------------------------------------ placement
    def place(self, values: list) -> None:
        """Where every buffer lives: outputs[j] for a result, else the arena (planner offsets,
        then buffers the plan leaves out, then one step's dot scratch)."""
        program = self.program
        dummy = {s["kernel"]: Kernel(lambda *a: None, pointers=True)  # C kernels
                 for s in walk(program) if s["op"] == "kernel"}
        plan = build(program, dummy, self.lowered.constants).plan
        self.storage: dict[tuple, str] = {}
        self.copies: list[tuple[int, Leaf]] = []
        for j, slot in enumerate(program["results"]):
            if j in self.kept:
                continue
            leaf = values[slot]
            planned = leaf.key in plan.offsets or leaf.key in plan.in_place
            if isinstance(leaf.key[0], int) and not planned and leaf.key not in self.storage:
                self.storage[leaf.key] = f"outputs[{j}]"
            else:
                self.copies.append((j, leaf))
        self.in_place, top = plan.in_place, _aligned(plan.arena_bytes)
        for (i, k), offset in plan.offsets.items():
            self.storage[(i, k)] = f"(xf_arena + {offset})"
        scratch = 0
        for i, step in enumerate(program["steps"]):
            if step["op"] == "alias" or i in self.windows:
                continue
            if i in self.loops:  # the final state's own buffers (never shared)
                for k, kind in enumerate(self.loops[i][0]):
                    leaf = values[step["outputs"][0]][k]
                    if kind != "pass" and leaf.key not in self.storage:
                        self.storage[leaf.key] = f"(xf_arena + {top})"
                        top += _aligned(leaf.nbytes)
                continue
            specs = [(step["dims"], step["dtype"])] if step["op"] == "dot" else step["specs"]
            for k, (dims, dtype) in enumerate(specs):
                if (i, k) not in self.storage and (i, k) not in plan.in_place:
                    self.storage[(i, k)] = f"(xf_arena + {top})"  # result-bound, no output of its own
                    top += _aligned(Leaf((), tuple(dims), dtype).nbytes)
            d = step.get("dot")
            if step["op"] == "kernel" and d is not None and not self._in_out(step):
                scratch = max(scratch, _aligned(Leaf((), tuple(d["dims"]), d["dtype"]).nbytes))
        for i, (parts, _) in self.parts.items():  # what a window's parts compute
            for k, slot in enumerate(parts.program["results"]):
                leaf = parts.values[slot]
                self.storage[(i, "part", k)] = f"(xf_arena + {top})"
                top += _aligned(leaf.nbytes)
        self.scratch_at, self.arena_bytes = top, top + scratch

    def pointer(self, leaf: Leaf, values: list) -> str:
        kind = leaf.key[0]
        if kind == "param":
            return f"inputs[{leaf.key[1]}]"
        if kind == "const":
            return self.body_constant(leaf.key[1])
        if leaf.key in self.in_place:  # a kernel writing over an input that dies here
            return self.pointer(values[self.in_place[leaf.key]], values)
        return self.storage[leaf.key]

    @staticmethod
    def _in_out(step: dict) -> bool:
        """The output fusion's dot goes straight into its first output."""
        d, (dims, dtype) = step["dot"], step["specs"][0]
        return bool(d["in_out"]) and d["dtype"] == dtype and \
            Leaf((), tuple(d["dims"]), dtype).size == Leaf((), tuple(dims), dtype).size

    # ------------------------------------------------------------------ code
    def body(self, function: str | None = None) -> str:
        """The C function `int <function>(const void *const *inputs, void *const *outputs)`
        (default: the exported `<name>_run`; a name given makes it static)."""
        values = self.values
        for key in self.program["constants"].values():
            self.body_constant(key)
        head = f"XF_API int {self.name}_run" if function is None else f"static int {function}"
        lines = [f"{head}(const void *const *inputs, void *const *outputs) {{"]
        emit = lambda depth, text: lines.append("    " * depth + text)  # noqa: E731
        emit(1, "int xf_status = 1;")
        emit(1, "char *xf_arena = NULL;  /* the temporaries, laid out by the runtime's planner */")
        if self.arena_bytes:
            emit(1, f"xf_arena = aligned_alloc({ALIGN}, {self.arena_bytes});")
            emit(1, "if (!xf_arena) return 1;")
        for i, step in enumerate(self.program["steps"]):
            if step["op"] == "alias":
                continue
            ins = [values[v] for v in step["inputs"]]
            outs = self._outputs(i, step, values)
            label = step.get("label", "dot_general")
            emit(1, f"/* {step['name']}: {label} -> {', '.join(map(str, outs))} */")
            if i in self.windows:
                self._window_copy(emit, i, step, ins, values)
            elif i in self.loops:
                self._loop_call(emit, i, ins, outs, values)
            elif step["op"] == "dot":
                fn = self._dot(step, step, [v.dtype for v in ins])
                emit(1, f"if ({fn}({', '.join(self._arg(v, values, const=True) for v in ins)}, "
                        f"{self._arg(outs[0], values)})) goto done;")
            else:
                self._kernel_call(emit, step, ins, outs, values)
        for j, leaf in self.copies:
            emit(1, f"memmove(outputs[{j}], {self.pointer(leaf, values)}, {leaf.nbytes});  /* result {j} */")
        emit(1, "xf_status = 0;")
        emit(0, "done:")
        emit(1, "free(xf_arena);")
        emit(1, "return xf_status;")
        emit(0, "}")
        return "\n".join([*self.functions, *lines])

    def _loop_call(self, emit, i: int, ins: list[Leaf], outs: list[Leaf], values: list) -> None:
        """The driver called on the initial state; an element the body writes in place (a
        window's) is first copied into the loop's own buffer."""
        kinds, fn = self.loops[i]
        emit(1, "{")
        for k, kind in enumerate(kinds):
            if kind == "owned":
                emit(2, f"memcpy({self.pointer(outs[k], values)}, {self.pointer(ins[k], values)}, {outs[k].nbytes});")
        init = [self.pointer(outs[k] if kind == "owned" else ins[k], values) for k, kind in enumerate(kinds)]
        final = [self.pointer(ins[k] if kind == "pass" else outs[k], values) for k, kind in enumerate(kinds)]
        emit(2, f"const void *xf_init[] = {{{', '.join(f'(const void *){p}' for p in init)}}};")
        emit(2, f"void *xf_final[] = {{{', '.join(f'(void *){p}' for p in final)}}};")
        emit(2, f"if ({fn}(xf_init, xf_final)) goto done;")
        emit(1, "}")

    def _outputs(self, i: int, step: dict, values: list) -> list[Leaf]:
        if step["op"] == "while":
            return list(values[step["outputs"][0]])
        if step["op"] == "dot":
            return [Leaf((i, 0), tuple(step["dims"]), step["dtype"])]
        return [Leaf((i, k), tuple(dims), dtype) for k, (dims, dtype) in enumerate(step["specs"])]

    def _arg(self, leaf: Leaf, values: list, const: bool = False) -> str:
        return f"({'const ' if const else ''}{_ctype(leaf.dtype)} *){self.pointer(leaf, values)}"

    def _kernel_call(self, emit, step: dict, ins: list[Leaf], outs: list[Leaf], values: list) -> None:
        args = [self._arg(v, values) for v in ins] + [self._arg(v, values) for v in outs]
        d, lead = step.get("dot"), ""
        if d is not None:
            fn = self._dot(d, step, [ins[d["operands"][0]].dtype, ins[d["operands"][1]].dtype])
            if self._in_out(step):
                block = f"({_ctype(d['dtype'])} *){self.pointer(outs[0], values)}"
            else:
                block = f"({_ctype(d['dtype'])} *)(xf_arena + {self.scratch_at})"
            operands = [self._arg(ins[k], values, const=True) for k in d["operands"]]
            emit(1, f"if ({fn}({', '.join(operands)}, {block})) goto done;")
            lead = f"0, {block}, "
        call = f"{step['kernel']}({{s}}, {{e}}, {lead}{', '.join(args)})"
        rows = step["rows"]
        if not (self.openmp and step["parallel"] and rows > 1):
            emit(1, f"if ({call.format(s=0, e=rows)}) goto done;")
            return
        emit(1, "{")
        emit(2, "int xf_failed = 0;")
        emit(0, "#ifdef _OPENMP")
        emit(0, "#pragma omp parallel reduction(|: xf_failed)")
        emit(0, "#endif")
        emit(2, "{")
        emit(3, f"const int64_t xf_s = {rows} * XF_THREAD / XF_THREADS, "
                f"xf_e = {rows} * (XF_THREAD + 1) / XF_THREADS;")
        emit(3, f"if (xf_s < xf_e) xf_failed |= {call.format(s='xf_s', e='xf_e')} != 0;")
        emit(2, "}")
        emit(2, "if (xf_failed) goto done;")
        emit(1, "}")

    def _window_copy(self, emit, i: int, step: dict, ins: list[Leaf], values: list) -> None:
        """The update copied into the target's window at the starts, each clamped so the
        window fits (as dynamic_update_slice clamps them), a contiguous run per row."""
        window = step["window"]
        parts, dims, udims = window["parts"], window["dims"], window["update_dims"]
        target = ins[window["target"]]
        constants = {int(slot): key for slot, key in parts["constants"].items()}

        def part(slot: int) -> Leaf | int:
            if slot in constants:
                return int(np.asarray(self.lowered.constants[constants[slot]]).reshape(-1)[0])
            return ins[parts["params"].index(slot)]

        if i in self.parts:  # computed into the arena by the parts' own function
            entry, fn = self.parts[i]
            self.functions.append(entry.body(fn))
            leaves = [entry.values[slot] for slot in parts["results"]]
            parts_in = ", ".join(f"(const void *){self.pointer(v, values)}" for v in ins) or "NULL"
            parts_out = ", ".join(self.storage[(i, "part", k)] for k in range(len(leaves)))
            emit(1, "{")
            emit(2, f"const void *xf_in[] = {{{parts_in}}};")
            emit(2, f"void *xf_out[] = {{{parts_out}}};")
            emit(2, f"if ({fn}(xf_in, xf_out)) goto done;")
            emit(1, "}")
            update, *starts = (Leaf((i, "part", k), v.dims, v.dtype) for k, v in enumerate(leaves))
        else:
            update, *starts = (part(slot) for slot in parts["results"])
        if not isinstance(update, Leaf):  # a constant update: a static array of its own
            update = Leaf(("const", constants[parts["results"][0]]), tuple(udims), target.dtype)
            self.body_constant(update.key[1])
        emit(1, "{")
        for d, (start, size, u) in enumerate(zip(starts, dims, udims)):
            read = str(start) if isinstance(start, int) else \
                f"(int64_t)*(const {_ctype(start.dtype)} *){self.pointer(start, values)}"
            emit(2, f"const int64_t xf_s{d} = XF_MIN(XF_MAX({read}, (int64_t)0), (int64_t){size - u});")
        rank, itemsize = len(udims), ITEMSIZE[target.dtype]
        to, at = f"(char *){self.pointer(target, values)}", f"(const char *){self.pointer(update, values)}"
        if rank == 0 or 0 in udims:
            if rank == 0:
                emit(2, f"memcpy({to}, {at}, {itemsize});")
            emit(1, "}")
            return
        for d in range(rank - 1):
            emit(2 + d, f"for (int64_t xf_i{d} = 0; xf_i{d} < {udims[d]}; xf_i{d}++)")
        offset, source = "0", "0"
        for d in range(rank):
            index = f"xf_s{d}" if d == rank - 1 else f"(xf_s{d} + xf_i{d})"
            offset = index if d == 0 else f"({offset}) * {dims[d]} + {index}"
            if d < rank - 1:
                source = f"xf_i{d}" if d == 0 else f"({source}) * {udims[d]} + xf_i{d}"
        source = f"({source}) * {udims[-1]}" if rank > 1 else "0"
        emit(1 + rank, f"memcpy({to} + ({offset}) * {itemsize}, {at} + {source} * {itemsize}, "
                       f"{udims[-1] * itemsize});")
        emit(1, "}")

    def body_constant(self, key: str) -> str:
        """The C name of the static array of constant `key` (written once per file)."""
        name = f"{self.shared.constant_prefix}{key}"
        if name not in self.shared.constants:
            array = np.ascontiguousarray(self.lowered.constants[key])
            self.shared.constants[name] = render._constant(name, array, _ctype(array.dtype.name))
        return name

    def _dot(self, d: dict, step: dict, operand_dtypes: list[str]) -> str:
        """The name of a new GEMM function for this dot_general."""
        fn = f"{self.shared.prefix}_dot_{len(self.dots)}"
        self.dots.append(gemm(fn, d, operand_dtypes, self.openmp, step["name"]))
        return fn


def _check_dtypes(what: str, leaves: list) -> None:
    for leaf in leaves:
        if isinstance(leaf, tuple):
            _check_dtypes(what, list(leaf))
        elif leaf.dtype in ("float16", "bfloat16"):
            raise ValueError(f"{what}: a {leaf.dtype} value; the C entry takes no f16/bf16 values "
                             "(the Python runtime widens them to f32 at each kernel; convert "
                             "the function to float32 for emit_c)")
        elif leaf.dtype not in ITEMSIZE:
            raise ValueError(f"{what}: a {leaf.dtype} value; the C entry has no {leaf.dtype} type")


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


__all__ = ["emit_c", "gemm", "generate"]
