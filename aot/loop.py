"""C loop drivers: a while step of an artifact (or of the C backend) run by one C function, so
an iteration never returns to Python. The condition and the body are each written as a
static function by `emit._Entry` (kernels called on all their rows, dots as C GEMMs, a window
copied in place); the driver calls them in turn until the condition is false:

    int <name>(const void *const *init, void *const *final)

`init[k]` holds state element k's initial value and `final[k]` receives its final one. Each
element is one of (`native_state` in the step):
- "new": the body computes it. The driver keeps two buffers, `final[k]` and one of its own,
  and swaps them each iteration (the body reads one and writes the other), so an update is
  never written over a value the body still reads; the initial value is only read.
- "pass": the body passes it along unchanged; `final[k]` is `init[k]`, never written.
- "owned": a window of the body writes it in place (a scan's stacked outputs); the caller
  passes a copy of its own as both `init[k]` and `final[k]`.
Returns 0, or 1 when memory could not be allocated.

A loop gets a driver when its condition and body hold only kernels, dots, windows whose parts
are picks, and aliases, over types C has (no f16/bf16), with every dot small (`SMALL_DOT`)
and no kernel large enough for the runtime to split its rows over threads (a driver runs
everything on the calling thread, where such a step's Python overhead is small beside its
work). Other loops stay with the runtime (`runtime/control.py`), which runs them step by step.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from xfuse.backends.numba.lowering import Lowered
from xfuse.runtime.program import walk

from .emit import ENTRY_PRELUDE, Leaf, Shared, _Entry

# Dots up to this many multiply-adds run in the driver as a C GEMM on one thread; a loop with
# larger ones stays with the runtime, whose dots go to BLAS on every core.
SMALL_DOT = 1 << 22


def loop_drivers(lowered: Lowered, prefix: str = "xf_loop") -> str:
    """Marks each while step of `lowered.program` (nested ones too) that a C driver can run
    with `native` (the driver's name) and `native_state` (each state element's kind); returns
    the drivers' C text, to be built into one library with the kernels ("" when none)."""
    shared, texts = Shared(prefix), []
    for step in walk(lowered.program):
        if step["op"] != "while" or "native" in step:
            continue
        name = f"{prefix}_{len(texts)}"
        mine = Shared(name, f"{name}_const_")
        try:
            text, kinds = driver(lowered, step, name, mine)
        except ValueError:
            continue  # the runtime runs this loop
        shared.constants.update(mine.constants)
        shared.dots.extend(mine.dots)
        step["native"], step["native_state"] = name, kinds
        texts.append(text)
    if not texts:
        return ""
    return "\n".join([ENTRY_PRELUDE, *shared.constants.values(), *shared.dots, *texts]) + "\n"


def _check(program: dict, what: str) -> None:
    for step in program["steps"]:
        where = f"{what}: step {step['name']!r}"
        if step["op"] == "kernel" and step["parallel"] and "window" not in step:
            raise ValueError(f"{where} splits its rows over threads")
        d = step if step["op"] == "dot" else step.get("dot")
        if step["op"] in ("dot", "kernel") and d is not None:
            lhs, rhs = d["lhs"], d["rhs"]
            contracted = int(np.prod([lhs[a] for a in d["contracting"][0]], dtype=np.int64))
            if int(np.prod(d["dims"], dtype=np.int64)) * contracted > SMALL_DOT:
                raise ValueError(f"{where} has a dot of {lhs} x {rhs}, larger than a driver's")


def driver(lowered: Lowered, step: dict, name: str, shared: Shared) -> tuple[str, list[str]]:
    """(C text of the driver `name` of a while step, the kind of each state element);
    ValueError when a driver cannot run the loop."""
    what = f"while {step['name']!r}"
    if not step["flat"]:
        raise ValueError(f"{what}: its body returns one tuple")
    _check(step["condition"], what)
    _check(step["body"], what)
    condition = _Entry(replace(lowered, program=step["condition"]), name, False, shared)
    body = _Entry(replace(lowered, program=step["body"]), name, False, shared, loop_body=True)
    (flag,) = [condition.values[slot] for slot in step["condition"]["results"]]
    if not (isinstance(flag, Leaf) and flag.dtype in ("bool", "bool_") and flag.size == 1):
        raise ValueError(f"{what}: its condition is no boolean scalar")
    written = set(body.windows.values())
    if not written <= body.kept:
        raise ValueError(f"{what}: a window writes a state element the body does not return in place")
    specs = step["body"]["param_specs"]
    kinds = ["new" if k not in body.kept else "owned" if k in written else "pass" for k in range(len(specs))]
    new = [(k, Leaf((), tuple(dims), dtype).nbytes) for k, (dims, dtype) in enumerate(specs) if kinds[k] == "new"]
    n = max(1, len(specs))
    lines = [condition.body(f"{name}_cond"), body.body(f"{name}_body"),
             f"/* {step['label']}: the whole loop; state kinds {', '.join(kinds)} */",
             f"XF_EXPORT int {name}(const void *const *init, void *const *final) {{",
             f"    const void *cur[{n}];",
             f"    void *nxt[{n}], *spare[{n}];",
             "    bool flag = 0;",
             "    void *flag_out[1] = {&flag};",
             "    int status = 1;",
             f"    for (int k = 0; k < {len(specs)}; k++) {{ cur[k] = init[k]; nxt[k] = final[k]; spare[k] = NULL; }}"]
    for k, nbytes in new:
        lines.append(f"    if (!(spare[{k}] = malloc({max(1, nbytes)}))) goto done;")
    lines += ["    for (;;) {",
              f"        if ({name}_cond(cur, flag_out)) goto done;",
              "        if (!flag) break;",
              f"        if ({name}_body(cur, nxt)) goto done;"]
    for k, _ in new:  # the new value becomes the state; its old buffer takes the next one
        lines.append(f"        {{ const void *old = cur[{k}]; cur[{k}] = nxt[{k}]; "
                     f"nxt[{k}] = old == init[{k}] ? spare[{k}] : (void *)old; }}")
    lines.append("    }")
    for k, nbytes in new:
        lines.append(f"    if (cur[{k}] != final[{k}]) memcpy(final[{k}], cur[{k}], {nbytes});")
    lines += ["    status = 0;", "done:"]
    lines += [f"    free(spare[{k}]);" for k, _ in new]
    lines += ["    return status;", "}"]
    return "\n".join(lines), kinds


__all__ = ["SMALL_DOT", "driver", "loop_drivers"]
