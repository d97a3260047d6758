"""Kernel programs rendered as C.

`backends/numba/kernels.py` writes each kernel in a small, explicitly typed subset of Python:
loops over `range`, assignments whose values are wrapped in their dtype (`np.float32(...)`),
loads and stores into C-ordered arrays of known shape, row views (`row = p0[k0]`), row buffers
(`scalar.row_buffer(n, dtype)` in the stack frame, longer ones `np.empty(n, dtype)`), and calls
to the math, scalar and row helpers. This module renders that
subset, statement by statement, as C: the same loops, the same order of operations, the same
helpers (`xfuse_kernels.h` is their C port), so the C kernels compute what the numba ones do.
Anything outside the subset raises `NotImplementedError` naming the construct and the kernel.

Python semantics kept in C: `//` and `%` on integers round toward minus infinity
(`XF_FLOORDIV`, `XF_FLOORMOD`); `~` of a boolean is logical not; integer arithmetic wraps
(`-fwrapv`); float literals are doubles unless wrapped in `np.float32`, as in numba.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CTYPES = {
    "float32": "float", "float64": "double", "bool_": "bool", "bool": "bool",
    "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
}  # fmt: skip
SUFFIX = {
    "f32": "float", "f64": "double", "s8": "int8_t", "s16": "int16_t", "s32": "int32_t",
    "s64": "int64_t", "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t",
    "pred": "bool",
}  # fmt: skip
FLOATS = ("float", "double")
INTEGERS = ("int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t")
UNARY_LIB = {"sqrt": "XF_SQRT", "floor": "XF_FLOOR", "ceil": "XF_CEIL", "rint": "XF_RINT",
             "trunc": "XF_TRUNC"}
HEADER = Path(__file__).with_name("xfuse_kernels.h")

# CPython 3.11's ast.parse keeps its recursion depth in state shared by all threads: a garbage
# collection that runs Python code mid-parse lets another thread's parse change it, and one of
# them fails with "SystemError: AST constructor recursion depth mismatch". One parse at a time.
_PARSING = threading.Lock()

OBJECT_ENTRY = "__objects"  # the suffix of a kernel's entry taking array objects

PRELUDE = r"""
#include <stdlib.h>
#define XF_EXPORT __attribute__((visibility("default")))
/* The data pointer of the numpy array whose object address is a[k]: a[0] is the offset of
   that pointer in the array object (PyArrayObject), which the runtime measured. */
#define XF_DATA(T, a, k) (*(T **)((char *)(intptr_t)(a)[k] + (a)[0]))
#define XF_MIN(a, b) ({ __auto_type xf_a = (a); __auto_type xf_b = (b); xf_a < xf_b ? xf_a : xf_b; })
#define XF_MAX(a, b) ({ __auto_type xf_a = (a); __auto_type xf_b = (b); xf_a > xf_b ? xf_a : xf_b; })
/* A select that reads both arms first (see Renderer.select). */
#define XF_SELECT(c, a, b) ({ __auto_type xf_t = (a); __auto_type xf_e = (b); (c) ? xf_t : xf_e; })
#define XF_ABS(x) _Generic((x), float: fabsf(x), double: fabs(x), \
    default: ({ __auto_type xf_x = (x); xf_x < 0 ? -xf_x : xf_x; }))
#define XF_SQRT(x) _Generic((x), float: sqrtf, default: sqrt)(x)
#define XF_FLOOR(x) _Generic((x), float: floorf, default: floor)(x)
#define XF_CEIL(x) _Generic((x), float: ceilf, default: ceil)(x)
#define XF_RINT(x) _Generic((x), float: rintf, default: rint)(x)
#define XF_TRUNC(x) _Generic((x), float: truncf, default: trunc)(x)
#define XF_FMOD(a, b) _Generic((a), float: fmodf, default: fmod)(a, b)
/* An integer converted to float is never -0.0, but under -fno-trapping-math gcc folds
   (float)(int)x into truncf(x), which keeps the sign of a zero; clearing the sign bit of a
   zero through its bits (which gcc does not reason about) restores +0.0. */
static inline float xf_unsign0_f32(float f) {
    uint32_t b; memcpy(&b, &f, 4); b &= f == 0.0f ? 0x7fffffffu : 0xffffffffu; memcpy(&f, &b, 4); return f; }
static inline double xf_unsign0_f64(double f) {
    uint64_t b; memcpy(&b, &f, 8); b &= f == 0.0 ? 0x7fffffffffffffffull : ~0ull; memcpy(&f, &b, 8); return f; }
/* Python's // and % on integers: the quotient rounded toward minus infinity. */
#define XF_FLOORDIV(a, b) ({ __auto_type xf_a = (a); __auto_type xf_b = (b); \
    __auto_type xf_q = xf_a / xf_b; \
    (xf_q * xf_b != xf_a && ((xf_a < 0) != (xf_b < 0))) ? xf_q - 1 : xf_q; })
#define XF_FLOORMOD(a, b) ({ __auto_type xf_a = (a); __auto_type xf_b = (b); \
    __auto_type xf_r = xf_a % xf_b; \
    (xf_r != 0 && ((xf_r < 0) != (xf_b < 0))) ? xf_r + xf_b : xf_r; })
"""


@dataclass(frozen=True)
class Arr:
    """An array value: its element type and dims (C order)."""

    ctype: str
    dims: tuple[int, ...]


def ctype_of(dtype) -> str:
    """The C type a kernel holds a dtype in (f16/bf16: float)."""
    name = np.dtype(dtype).name
    if name in ("float16", "bfloat16"):
        return "float"
    return CTYPES[name]


def header_text() -> str:
    return HEADER.read_text()


def library_source(kernels: list[str]) -> str:
    """One C file: the helpers, then every kernel (each as `render_kernel` writes it)."""
    parts = ["/* Generated by xfuse: fused kernels and the helpers they call. */",
             header_text(), PRELUDE, *kernels]
    return "\n".join(parts) + "\n"


def render_kernel(source, args: list[tuple[tuple[int, ...], object]]) -> str:
    """The C text of one kernel (its helpers first); `args` gives the (dims, dtype) of its
    arguments after `row_start, row_end` (and `dot_start`): the dot block, the params, the
    outputs."""
    return Renderer(source.name, source.globals).module(source.source, args)


class Renderer:
    def __init__(self, kernel: str, globals_: dict) -> None:
        self.kernel = kernel
        self.scopes: list[dict[str, object]] = [{}]
        self.helpers: dict[str, tuple[str, str]] = {}  # helper name -> (C name, return C type)
        self.globals: dict[str, tuple[str, Arr]] = {}  # python name -> (C name, array)
        self.out: list[str] = []
        self.constants: list[str] = []
        for name, value in globals_.items():
            array = np.ascontiguousarray(value)
            c_name = f"{kernel}_{name}"
            arr = Arr(ctype_of(array.dtype), array.shape or (1,))
            self.globals[name] = (c_name, arr)
            self.constants.append(_constant(c_name, array, arr.ctype))

    def fail(self, node: ast.AST, what: str):
        text = ast.unparse(node) if isinstance(node, ast.AST) else str(node)
        return NotImplementedError(f"the C renderer cannot render {what} in kernel {self.kernel}: {text}")

    # ------------------------------------------------------------------ scopes
    def lookup(self, name: str):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.globals:
            return self.globals[name][1]
        return None

    def declare(self, name: str, kind) -> None:
        self.scopes[-1][name] = kind

    def emit(self, depth: int, text: str) -> None:
        self.out.append("    " * depth + text)

    # ------------------------------------------------------------------ module
    def module(self, text: str, args) -> str:
        with _PARSING:
            tree = ast.parse(text)
        kernel = None
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                raise self.fail(node, "a top-level statement")
            if node.name == self.kernel:
                kernel = node
            else:
                self.helper(node)
        if kernel is None:
            raise self.fail(tree, f"a module without the function {self.kernel}")
        self.function(kernel, args)
        return "\n".join(self.constants + self.out) + "\n"

    def helper(self, node: ast.FunctionDef) -> None:
        suffix = node.name.rsplit("_", 1)[-1]
        if suffix not in SUFFIX:
            raise self.fail(node, f"the helper {node.name} (no dtype suffix)")
        ctype = SUFFIX[suffix]
        c_name = f"{self.kernel}_{node.name}"
        self.helpers[node.name] = (c_name, ctype)
        params = ", ".join(f"{ctype} {a.arg}" for a in node.args.args)
        self.scopes.append({a.arg: ctype for a in node.args.args})
        self.emit(0, f"static inline {ctype} {c_name}({params}) {{")
        self.block(node.body, 1)
        self.emit(0, "}")
        self.scopes.pop()

    def function(self, node: ast.FunctionDef, args) -> None:
        names = [a.arg for a in node.args.args]
        ints = [n for n in names if n in ("row_start", "row_end", "dot_start")]
        if len(names) - len(ints) != len(args):
            raise self.fail(node, f"a signature with {len(names) - len(ints)} arrays for {len(args)} arguments")
        params = [f"int64_t {n}" for n in ints]
        scope = {n: "int64_t" for n in ints}
        for n, (dims, dtype) in zip(names[len(ints):], args):
            arr = Arr(ctype_of(dtype), tuple(dims) or (1,))
            scope[n] = arr
            params.append(f"{arr.ctype} *{n}")
        self.scopes.append(scope)
        self.emit(0, f"XF_EXPORT int {node.name}({', '.join(params)}) {{")
        self.scratch: list[str] = []
        self.block(node.body, 1)
        for buf in reversed(self.scratch):
            self.emit(1, f"free({buf});")
        self.emit(1, "return 0;")
        self.emit(0, "}")
        self.scopes.pop()
        # The runtime's way in (runtime/native.py): one pointer to [data offset, the integers,
        # the array objects], a quarter of the cost of ctypes converting every argument.
        pass_on = [f"a[{k + 1}]" for k in range(len(ints))]
        pass_on += [f"XF_DATA({arr.ctype}, a, {k + 1 + len(ints)})"
                    for k, arr in enumerate(scope[n] for n in names[len(ints):])]
        self.emit(0, "#ifndef XF_NO_OBJECT_ENTRIES")
        self.emit(0, f"XF_EXPORT int {node.name}{OBJECT_ENTRY}(const int64_t *a) {{")
        self.emit(1, f"return {node.name}({', '.join(pass_on)});")
        self.emit(0, "}")
        self.emit(0, "#endif")

    # ------------------------------------------------------------------ statements
    def block(self, body: list[ast.stmt], depth: int) -> None:
        for stmt in body:
            self.statement(stmt, depth)

    def statement(self, node: ast.stmt, depth: int) -> None:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            self.assign(node.targets[0], node.value, depth)
        elif isinstance(node, ast.For):
            self.loop(node, depth)
        elif isinstance(node, ast.Return):
            self.emit(depth, f"return {self.expr(node.value)[0]};")
        elif isinstance(node, ast.If):
            self.emit(depth, f"if ({self.expr(node.test)[0]}) {{")
            self.scopes.append({})
            self.block(node.body, depth + 1)
            self.scopes.pop()
            if node.orelse:
                self.emit(depth, "} else {")
                self.scopes.append({})
                self.block(node.orelse, depth + 1)
                self.scopes.pop()
            self.emit(depth, "}")
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            self.assign(node.target, ast.BinOp(node.target, node.op, node.value), depth)
        else:
            raise self.fail(node, "a statement")

    def loop(self, node: ast.For, depth: int) -> None:
        it = node.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                and isinstance(node.target, ast.Name) and not node.orelse and 1 <= len(it.args) <= 3):
            raise self.fail(node, "a loop other than `for i in range(...)`")
        bounds = [self.expr(a)[0] for a in it.args]
        start, end = ("0", bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
        step = bounds[2] if len(bounds) == 3 else "1"
        var = node.target.id
        increment = f"++{var}" if step == "1" else f"{var} += {step}"
        self.emit(depth, f"for (int64_t {var} = {start}; {var} < {end}; {increment}) {{")
        self.scopes.append({var: "int64_t"})
        self.block(node.body, depth + 1)
        self.scopes.pop()
        self.emit(depth, "}")

    def assign(self, target: ast.expr, value: ast.expr, depth: int) -> None:
        if isinstance(target, ast.Subscript):
            lvalue, _ = self.subscript(target)
            self.emit(depth, f"{lvalue} = {self.expr(value)[0]};")
            return
        if not isinstance(target, ast.Name):
            raise self.fail(target, "an assignment target")
        name = target.id
        on_stack = _is_call(value, "scalar", "row_buffer")  # in the stack frame, as numba's
        if on_stack or _is_call(value, "np", "empty"):
            n, dtype = value.args
            arr = Arr(self.dtype_arg(dtype), (self.const_int(n),))
            self.declare(name, arr)
            if on_stack:
                self.emit(depth, f"{arr.ctype} {name}[{arr.dims[0]}] __attribute__((aligned(64)));")
                return
            self.scratch.append(name)
            self.emit(depth, f"{arr.ctype} *{name} = malloc({arr.dims[0]} * sizeof({arr.ctype}) + 1);")
            self.emit(depth, f"if (!{name}) return 1;" if len(self.scratch) == 1 else
                      f"if (!{name}) {{ {' '.join(f'free({b});' for b in self.scratch[:-1])} return 1; }}")
            return
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in ("ravel", "reshape") and isinstance(value.func.value, ast.Name):
            source = self.lookup(value.func.value.id)
            if not isinstance(source, Arr):
                raise self.fail(value, "a reshape of a non-array")
            size = int(np.prod(source.dims))
            if value.func.attr == "reshape" and (len(value.args) != 1 or self.const_int(value.args[0]) != size):
                raise self.fail(value, "a reshape that is not to one dimension")
            flat = Arr(source.ctype, (size,))
            if value.func.value.id == name:
                self._rebind(name, flat)
            else:
                self.declare(name, flat)
                self.emit(depth, f"{flat.ctype} *{name} = {value.func.value.id};")
            return
        text, kind = self.expr(value)
        existing = self.lookup(name)
        if isinstance(kind, Arr):
            if existing is not None:
                raise self.fail(target, "an array view assigned twice")
            self.declare(name, kind)
            self.emit(depth, f"{kind.ctype} *{name} = {text};")
            return
        if existing is not None and not isinstance(existing, Arr):
            self.emit(depth, f"{name} = {text};")
            return
        self.declare(name, kind)
        self.emit(depth, f"{kind or '__auto_type'} {name} = {text};")

    def _rebind(self, name: str, kind) -> None:
        for scope in reversed(self.scopes):
            if name in scope:
                scope[name] = kind
                return
        raise KeyError(name)

    # ------------------------------------------------------------------ expressions
    def const_int(self, node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise self.fail(node, "a size that is not a literal")

    def dtype_arg(self, node: ast.expr) -> str:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "np" \
                and node.attr in CTYPES:
            return CTYPES[node.attr]
        raise self.fail(node, "a dtype")

    def expr(self, node: ast.expr) -> tuple[str, object]:
        """(C text, type): a C type name, an `Arr`, or None where unknown."""
        if isinstance(node, ast.Name):
            kind = self.lookup(node.id)
            if kind is None:
                raise self.fail(node, "an unknown name")
            if node.id in self.globals and self.globals[node.id][1] is kind:
                return self.globals[node.id][0], kind
            return node.id, kind
        if isinstance(node, ast.Constant):
            return _literal(node.value)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "np":
                if node.attr == "nan":
                    return "((double)NAN)", "double"
                if node.attr == "inf":
                    return "((double)INFINITY)", "double"
            raise self.fail(node, "an attribute")
        if isinstance(node, ast.UnaryOp):
            text, kind = self.expr(node.operand)
            if isinstance(node.op, ast.USub):
                return f"(-{text})", kind
            if isinstance(node.op, ast.Not):
                return f"(!{text})", "bool"
            if isinstance(node.op, ast.Invert):
                return (f"(!{text})", "bool") if kind == "bool" else (f"(~{text})", kind)
            raise self.fail(node, "a unary operator")
        if isinstance(node, ast.BinOp):
            return self.binop(node)
        if isinstance(node, ast.BoolOp):
            word = " && " if isinstance(node.op, ast.And) else " || "
            return "(" + word.join(self.expr(v)[0] for v in node.values) + ")", "bool"
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise self.fail(node, "a chained comparison")
            op = _COMPARE.get(type(node.ops[0]))
            if op is None:
                raise self.fail(node, "a comparison")
            return f"({self.expr(node.left)[0]} {op} {self.expr(node.comparators[0])[0]})", "bool"
        if isinstance(node, ast.IfExp):
            return self.select(node)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise self.fail(node, "an expression")

    def select(self, node: ast.IfExp) -> tuple[str, object]:
        """`a if c else b`. Where an arm reads memory, both arms are read first and the select
        picks one: a C `?:` reads only the arm it picks, and in a loop gcc then if-converts the
        read into a masked load, which gcc 12's vectoriser miscompiles at -march=x86-64-v3 and up
        (a select between two reads of a 7x3x2 loop nest read elements 4 places early). The
        kernels' arms are safe to read either way: the emitter clamps every index into its
        array, as numba's code reads them unclamped too. An arm with an integer division or
        remainder (which could trap on the arm not picked) keeps the C `?:`."""
        test = self.expr(node.test)[0]
        body, kind = self.expr(node.body)
        other, other_kind = self.expr(node.orelse)
        arms = (node.body, node.orelse)
        if any(_reads(arm) for arm in arms) and not any(_may_trap(arm) for arm in arms):
            return f"XF_SELECT({test}, {body}, {other})", _promote(kind, other_kind)
        return f"({test} ? {body} : {other})", _promote(kind, other_kind)

    def binop(self, node: ast.BinOp) -> tuple[str, object]:
        left, lk = self.expr(node.left)
        right, rk = self.expr(node.right)
        kind = _promote(lk, rk)
        if isinstance(node.op, ast.FloorDiv):
            return f"XF_FLOORDIV({left}, {right})", kind
        if isinstance(node.op, ast.Mod):
            if kind in FLOATS:
                raise self.fail(node, "a float `%`")
            return f"XF_FLOORMOD({left}, {right})", kind
        op = _BINARY.get(type(node.op))
        if op is None:
            raise self.fail(node, "a binary operator")
        if isinstance(node.op, ast.Div) and kind not in FLOATS:
            raise self.fail(node, "an integer `/`")
        if op in ("&", "|", "^") and lk == rk == "bool":
            kind = "bool"
        return f"({left} {op} {right})", kind

    def subscript(self, node: ast.Subscript) -> tuple[str, object]:
        base, arr = self.expr(node.value)
        if not isinstance(arr, Arr):
            raise self.fail(node, "a subscript of a non-array")
        index = node.slice
        if isinstance(index, ast.Slice):
            if index.lower is not None and not (isinstance(index.lower, ast.Constant) and index.lower.value == 0) \
                    or index.step is not None or index.upper is None:
                raise self.fail(node, "a slice other than [:n]")
            return base, Arr(arr.ctype, (self.const_int(index.upper),) + arr.dims[1:])
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        if len(parts) > len(arr.dims):
            raise self.fail(node, f"{len(parts)} indices into {len(arr.dims)} dimensions")
        terms = []
        for k, part in enumerate(parts):
            text = self.expr(part)[0]
            stride = int(np.prod(arr.dims[k + 1 :], dtype=np.int64))
            terms.append(text if stride == 1 else f"({text}) * {stride}")
        linear = " + ".join(terms)
        if len(parts) == len(arr.dims):
            return f"{base}[{linear}]", arr.ctype
        return f"({base} + {linear})", Arr(arr.ctype, arr.dims[len(parts):])

    def call(self, node: ast.Call) -> tuple[str, object]:
        func = node.func
        if node.keywords:
            raise self.fail(node, "a call with keywords")
        args = [self.expr(a) for a in node.args]
        texts = [t for t, _ in args]
        if isinstance(func, ast.Name):
            name = func.id
            if name == "U" and len(args) == 1:
                return args[0]
            if name == "abs" and len(args) == 1:
                return f"XF_ABS({texts[0]})", args[0][1]
            if name in ("min", "max") and len(args) == 2:
                return f"XF_{name.upper()}({texts[0]}, {texts[1]})", _promote(args[0][1], args[1][1])
            if name in self.helpers:
                c_name, ctype = self.helpers[name]
                return f"{c_name}({', '.join(texts)})", ctype
            raise self.fail(node, "a call")
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            raise self.fail(node, "a call")
        module, name = func.value.id, func.attr
        if module == "np":
            if name in CTYPES and len(args) == 1:
                ctype = CTYPES[name]
                if ctype in FLOATS and args[0][1] in INTEGERS:  # see XF_UNSIGN0_*: int 0 is +0.0
                    return f"xf_unsign0_{'f32' if ctype == 'float' else 'f64'}(({ctype})({texts[0]}))", ctype
                return f"(({ctype})({texts[0]}))", ctype
            if name in UNARY_LIB and len(args) == 1:
                return f"{UNARY_LIB[name]}({texts[0]})", args[0][1]
            if name == "fmod" and len(args) == 2:
                return f"XF_FMOD({texts[0]}, {texts[1]})", args[0][1]
        elif module == "mathlib":
            return f"{name}({', '.join(texts)})", SUFFIX.get(name.rsplit("_", 1)[-1])
        elif module == "scalar":
            if name in ("round_f16", "round_bf16", "bits_f16", "bits_bf16"):
                kind = "float"
            elif name in ("f16_bits", "bf16_bits"):
                kind = "uint16_t"
            elif name == "is_finite":
                kind = "bool"
            elif name == "clamp":
                kind = "int64_t"
            elif name.startswith("bitcast_"):
                kind = SUFFIX[name[len("bitcast_"):]]
            else:
                kind = args[0][1] if args else None
            return f"scalar_{name}({', '.join(texts)})", kind
        elif module == "rows" and len(args) == 1 and isinstance(args[0][1], Arr):
            arr = args[0][1]
            kind = "int64_t" if name.startswith("arg") else SUFFIX.get(name.rsplit("_", 1)[-1])
            return f"rows_{name}({texts[0]}, {arr.dims[0]})", kind
        raise self.fail(node, "a call")


_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.LShift: "<<", ast.RShift: ">>",
           ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^"}
_RANK = ["bool", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t", "uint64_t",
         "float", "double"]


def _promote(a, b):
    """The type of a binary expression, as far as the renderer needs it (floats and bools)."""
    if a == b:
        return a
    if a in _RANK and b in _RANK:
        if "double" in (a, b):
            return "double"
        if "float" in (a, b):
            return "float"
        return _RANK[max(_RANK.index(a), _RANK.index(b), _RANK.index("int32_t"))]
    return a if b is None else b if a is None else None


def _reads(node: ast.expr) -> bool:
    """Whether the expression reads an array element."""
    return any(isinstance(n, ast.Subscript) for n in ast.walk(node))


def _may_trap(node: ast.expr) -> bool:
    """Whether the expression divides by a value that is not a nonzero literal (an integer
    division by zero traps in C)."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.FloorDiv, ast.Mod))
               and not (isinstance(n.right, ast.Constant) and n.right.value)
               for n in ast.walk(node))


def _is_call(node: ast.expr, module: str, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name \
        and isinstance(node.func.value, ast.Name) and node.func.value.id == module


def _literal(value) -> tuple[str, str]:
    if isinstance(value, bool):
        return ("1" if value else "0"), "bool"
    if isinstance(value, int):
        if value > 2**63 - 1:
            return f"{value}ULL", "uint64_t"
        if value < -(2**63 - 1):
            return f"(-{-value - 1}LL - 1)", "int64_t"
        return (f"{value}LL" if not -(2**31) <= value < 2**31 else str(value)), "int64_t"
    if isinstance(value, float):
        return _double(value), "double"
    raise NotImplementedError(f"the C renderer cannot render the literal {value!r}")


def _double(x: float) -> str:
    if x != x:
        return "((double)NAN)"
    if x in (float("inf"), float("-inf")):
        return "((double)INFINITY)" if x > 0 else "(-(double)INFINITY)"
    return f"({x.hex()})" if x < 0 else x.hex()


def _constant(c_name: str, array: np.ndarray, ctype: str) -> str:
    """A constant array as a static C array of its compute type, its values exact."""
    flat = array.reshape(-1)
    if ctype in FLOATS:
        items = []
        for v in flat.astype(np.float64):
            text = _double(float(v))
            items.append(f"(float){text}" if ctype == "float" and "NAN" not in text and "INF" not in text else text)
    elif ctype == "bool":
        items = ["1" if v else "0" for v in flat]
    else:
        items = [_literal(int(v))[0] for v in flat]
    body = ",\n    ".join(", ".join(items[i : i + 8]) for i in range(0, len(items), 8)) or "0"
    return f"static const {ctype} {c_name}[{max(1, flat.size)}] = {{\n    {body}\n}};"
