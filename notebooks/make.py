"""Writes the notebooks of this folder from the cells below and executes them in place, so the
committed copies keep their outputs: `python notebooks/make.py` (from the repository root).
tests/notebooks/test_notebooks.py executes the committed copies again in CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent

# The function and inputs the tour and the AOT notebook share.
MLP = """def mlp(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 512), dtype=np.float32)
w = rng.standard_normal((512, 1024), dtype=np.float32) / 20
b = rng.standard_normal(1024, dtype=np.float32)
"""

TOUR = [
    ("md", """# A tour of fusion: softmax(relu(x @ w + b))

From JAX code to the jaxpr, xfuse's HLO, each optimisation pass, the fused module, its kernel
and its speed against `jax.jit`. Every object below renders itself in the notebook."""),
    ("code", """import time
import jax
import numpy as np
import xfuse

""" + MLP + """jax.make_jaxpr(mlp)(x, w, b)"""),
    ("md", "The frontend turns the jaxpr into HLO, one instruction per primitive, each carrying its source line:"),
    ("code", """f = xfuse.jit(mlp)
lowered = f.lower(x, w, b)
print(lowered.as_text())"""),
    ("md", "The pipeline runs its passes; `pass_history()` keeps the module after each, and `pass_diff` compares any two:"),
    ("code", """compiled = lowered.compile()
for record in compiled.pass_history():
    print(f"{record.name:10s} changed={record.changed}")
print(compiled.pass_diff("dce", "fuse"))"""),
    ("md", """The compiled function, drawn: one cluster per fusion (here the dot and its whole epilogue,
bias, relu and the softmax, are one kernel), the fused HLO, the fusion report with every
candidate taken or refused, the cost analysis and the generated kernel:"""),
    ("code", "compiled"),
    ("code", "print(compiled.fusion_report())"),
    ("md", "XLA, for comparison, splits the same function into several kernels:"),
    ("code", """xla_text = jax.jit(mlp).lower(x, w, b).compile().as_text()
entry = xla_text[xla_text.index("ENTRY"):]
print("\\n".join(line for line in entry.splitlines() if " fusion(" in line or " dot(" in line or "custom-call" in line))"""),
    ("md", """Speed, timed here in one process (the benchmark suite, `python -m benchmarks`, times each
engine in a process of its own; see `02_performance.ipynb`):"""),
    ("code", """def best(fn, n=50):
    fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return min(times)

jitted = jax.jit(mlp)
t_xfuse = best(lambda: compiled(x, w, b))
t_jax = best(lambda: jitted(x, w, b).block_until_ready())
np.testing.assert_allclose(compiled(x, w, b), jitted(x, w, b), rtol=1e-4, atol=1e-6)
print(f"xfuse {t_xfuse * 1e6:.0f} us, jax.jit {t_jax * 1e6:.0f} us (results agree)")"""),
]

PERFORMANCE = [
    ("md", """# The benchmark suite's results

`python -m benchmarks` writes `benchmarks/results/latest.json`; this notebook plots it. Each
engine ran in its own process; times are medians of several runs."""),
    ("code", """import json
from pathlib import Path
import matplotlib.pyplot as plt

root = Path.cwd() if (Path.cwd() / "benchmarks").is_dir() else Path.cwd().parent
results = json.loads((root / "benchmarks" / "results" / "latest.json").read_text())
meta = results["meta"]
print(meta["date"], meta["machine"]["cpu"], f"{meta['machine']['cores']} cores", meta["versions"])"""),
    ("code", """names = [w["name"] for w in results["workloads"]]
engines = [e for e in ("xfuse", "numpy", "numexpr") if any(e in w["speedup_vs_jax"] for w in results["workloads"])]
fig, ax = plt.subplots(figsize=(10, 4))
width = 0.8 / len(engines)
for k, engine in enumerate(engines):
    values = [w["speedup_vs_jax"].get(engine) or 0 for w in results["workloads"]]
    ax.bar([i + k * width for i in range(len(names))], values, width, label=engine)
ax.axhline(1.0, color="black", linewidth=0.8)
ax.set_yscale("log")
ax.set_ylabel("speed-up over jax.jit")
ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=35, ha="right")
ax.legend()
fig.tight_layout()
plt.show()"""),
    ("code", """for w in results["workloads"]:
    times = {e: r.get("time_s") for e, r in w["engines"].items()}
    line = ", ".join(f"{e} {t * 1e3:.3f} ms" for e, t in times.items() if t)
    print(f"{w['name']:28s} {line}")"""),
]

AOT = [
    ("md", """# Ahead of time: compile, save, load, run

An artifact holds native code for every kernel, the buffer plan and a manifest; loading and
running it needs numpy alone."""),
    ("code", """import subprocess, sys, tempfile
from pathlib import Path
import jax
import numpy as np
import xfuse
import xfuse.aot

""" + MLP + """folder = Path(tempfile.mkdtemp())
path = xfuse.jit(mlp).lower(x, w, b).compile().save(folder / "mlp.xfa")
print(f"{path.name}: {path.stat().st_size / 1024:.1f} KiB")
print(xfuse.aot.inspect(path))"""),
    ("md", "Loaded in a fresh process where jax and numba cannot even be imported:"),
    ("code", """np.savez(folder / "in.npz", x=x, w=w, b=b)
code = f'''
import sys, time
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "numba", "llvmlite"):
            raise ImportError(name + " is blocked here")
sys.meta_path.insert(0, Blocked())
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import xfuse.aot
f = xfuse.aot.load({str(path)!r})
d = np.load({str(folder / "in.npz")!r})
y = f(d["x"], d["w"], d["b"])
t2 = time.perf_counter()
np.save({str(folder / "out.npy")!r}, y)
print(f"numpy import {{(t1 - t0) * 1e3:.1f}} ms; load + first call {{(t2 - t1) * 1e3:.1f}} ms")
print("jax imported:", "jax" in sys.modules, "| numba imported:", "numba" in sys.modules)
'''
print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
np.testing.assert_allclose(np.load(folder / "out.npy"), jax.jit(mlp)(x, w, b), rtol=1e-4, atol=1e-6)
print("the artifact's result agrees with jax.jit")"""),
]


def build(name: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src)
                for kind, src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 600) -> nbformat.NotebookNode:
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


NOTEBOOKS = {"01_fusion_tour.ipynb": TOUR, "02_performance.ipynb": PERFORMANCE, "03_aot.ipynb": AOT}


def main() -> int:
    for name, cells in NOTEBOOKS.items():
        nb = execute(build(name, cells), HERE)
        nbformat.write(nb, HERE / name)
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
