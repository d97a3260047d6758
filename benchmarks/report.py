"""Presenting results: progress lines while the suite runs, the printed tables (the workloads',
or the corpus programs' with `corpus_tables`), and the bar chart of speed-ups over jax.jit
(matplotlib when installed, else `png.bar_chart`).

Imports numpy-free standard library only; matplotlib inside `chart`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .engines import LABELS


class Progress:
    """`[  12.3 s] workload  engine ... result` lines on stderr, so stdout holds the tables."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def step(self, workload: str, what: str) -> None:
        elapsed = time.perf_counter() - self.start
        print(f"[{elapsed:7.1f} s] {workload:30} {what:30}", end=" ", file=sys.stderr, flush=True)

    def done(self, text: str | None) -> None:
        print(text or "", file=sys.stderr, flush=True)


def status(result: dict, key: str) -> str:
    if not result.get("ok"):
        return "ERROR " + str(result.get("error", ""))[:160]
    text = seconds(result.get(key))
    if result.get("error"):
        text += "  " + result["error"]
    return text


def seconds(value: float | None) -> str:
    """A duration with a unit that keeps three significant figures: 812 us, 4.56 ms, 1.23 s."""
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.3g} us"
    if value < 1.0:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _grid(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first `left` columns left-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *map(line, rows)])


def _time_cell(row: dict, engine: str, notes: list[str], describe) -> str:
    """An engine's time in a row, or ERROR / WRONG with a note (`describe` words the error)."""
    result = row["engines"].get(engine)
    if result is None:
        return "n/a"
    if not result.get("ok") or result.get("error"):
        notes.append(f"{LABELS[engine]} on {row['name']}: {describe(result)}")
        mark = "ERROR" if not result.get("ok") else seconds(result.get("time_s")) + " WRONG"
        return f"{mark} [{len(notes)}]"
    return seconds(result.get("time_s"))


def _notes(notes: list[str]) -> list[str]:
    """The numbered notes a table's cells point to, as lines after it."""
    if not notes:
        return []
    return ["", "Errors and wrong results:", *(f"  [{i}] {note}" for i, note in enumerate(notes, 1))]


def tables(results: dict) -> str:
    engines = results["meta"]["engines"]
    others = [e for e in engines if e != "jax"]
    notes: list[str] = []

    def time_cell(row: dict, engine: str) -> str:
        return _time_cell(row, engine, notes, _error_text)

    header = ["workload", *(LABELS[e] for e in engines)]
    header += [f"{LABELS[e]} vs jax" for e in others]
    rows = []
    for row in results["workloads"]:
        cells = [row["name"], *(time_cell(row, e) for e in engines)]
        cells += [ratio(row["speedup_vs_jax"].get(e)) for e in others]
        rows.append(cells)
    speed = _grid(header, rows)

    header = ["workload", "kernels xfuse", "kernels XLA", "xfuse compile cold", "warm"]
    header += ["jax.jit compile", "peak MiB xfuse", "jax.jit", "workload MiB xfuse", "jax.jit"]
    header += ["bytes moved"]
    header += [f"BW {LABELS[e]}" for e in engines]
    rows = []
    for row in results["workloads"]:
        kernels, compile_ = row["kernels"], row["compile"]
        cold = seconds(compile_["xfuse_cold_s"])
        if compile_.get("xfuse_cold_error"):
            cold = "ERROR"
        cells = [
            row["name"],
            _count(kernels["xfuse"]),
            _count(kernels["xla"]),
            cold,
            seconds(compile_["xfuse_warm_s"]),
            seconds(compile_["jax_s"]),
            _mib(row.get("peak_rss_bytes", {}).get("xfuse")),
            _mib(row.get("peak_rss_bytes", {}).get("jax")),
            _mib(row.get("workload_rss_bytes", {}).get("xfuse")),
            _mib(row.get("workload_rss_bytes", {}).get("jax")),
            _megabytes(row["bytes_moved"]),
        ]
        fractions = row["bandwidth_fraction"] if row["memory_bound"] else {}
        cells += [percent(fractions.get(e)) for e in engines]
        rows.append(cells)
    costs = _grid(header, rows)

    meta, bandwidth = results["meta"], results["bandwidth"]
    processes = meta.get("processes", 1)
    lines = [
        f"xfuse benchmarks, {meta['date']}, {_machine(meta['machine'])}, "
        f"xfuse backend: {meta['xfuse_backend']}"
        + (", QUICK mode" if meta["quick"] else ""),
        "",
        "Median time per call; 'vs jax' is the speed-up over jax.jit (jax.jit time / engine "
        "time, above 1x is faster)."
        + (f" Each engine ran in {processes} processes, in turns with the others; the median "
           "process counts (all of them below)." if processes > 1 else ""),
        "",
        speed,
        "",
        "Kernels launched (xfuse: compiled.kernel_count(); XLA: compute instructions of the "
        "optimised ENTRY computation).",
        "Compile: lower + compile + first call; cold = first fresh process, warm = a second one.",
        "Peak MiB: the timing process's peak resident memory (imports included: xfuse's process "
        "imports jax too); workload MiB: that peak less the memory after start-up and inputs.",
        "BW: (inputs + outputs bytes) / time as a fraction of the NumPy copy bandwidth, for the "
        "memory-bound workloads.",
        "",
        costs,
        "",
        *([process_table(results), ""] if processes > 1 else []),
        _load_line(meta),
        "copy bandwidth (np.copyto, read + write, "
        f"{_megabytes(bandwidth.get('buffer_bytes', 0))} buffer): "
        + (f"{bandwidth['gbps']:.1f} GB/s" if bandwidth.get("gbps") else "ERROR"),
    ]
    bare = results.get("bare_numba_call") or {}
    tiny = next((r for r in results["workloads"] if r["name"].startswith("tiny")), None)
    if bare.get("time_s") and tiny and tiny["engines"].get("xfuse", {}).get("time_s"):
        ours = tiny["engines"]["xfuse"]["time_s"]
        lines.append(f"per-call overhead: xfuse {ours * 1e6:.2f} us, a bare numba call "
                     f"{bare['time_s'] * 1e6:.2f} us ({ours / bare['time_s']:.1f}x)")
    for engine, summary in results["summary"].items():
        mean, fastest = summary["geomean_speedup_vs_jax"], summary.get("geomean_speedup_vs_jax_fastest")
        between = f" ({ratio(fastest)} between each engine's fastest processes)" if fastest else ""
        lines.append(
            f"geometric mean speed-up of {LABELS[engine]} over jax.jit: {ratio(mean)} "
            f"over {summary['workloads_counted']} of {summary['workloads_run']} workloads{between}"
        )
    return "\n".join(lines + _notes(notes))


def corpus_tables(results: dict) -> str:
    """The corpus run's table: per program the time per call on each engine, the speed-up,
    kernels, steps per call and the times to first result; errors and wrong results below."""
    meta = results["meta"]
    engines = meta["engines"]
    notes: list[str] = []

    def time_cell(row: dict, engine: str) -> str:
        return _time_cell(row, engine, notes, _program_error)

    header = ["program", "library", *(LABELS[e] for e in engines), "xfuse vs jax",
              "kernels xfuse", "kernels XLA", "steps/call", "first result xfuse",
              "xfuse native", "xfuse cached", "jax.jit"]
    rows = []
    for row in results["programs"]:
        first = row["first_result_s"]
        rows.append([
            row["name"],
            row["library"],
            *(time_cell(row, e) for e in engines),
            ratio(row["speedup_vs_jax"].get("xfuse")),
            _count(row["kernels"]["xfuse"]),
            _count(row["kernels"]["xla"]),
            _count(row["steps_per_call"]),
            seconds(first["xfuse"]),
            seconds(first.get("xfuse_native")),
            seconds(first["xfuse_cached"]),
            seconds(first["jax"]),
        ])
    processes = meta.get("processes", 1)
    lines = [
        f"xfuse on real programs ({meta['size']} size), {meta['date']}, "
        f"{_machine(meta['machine'])}, xfuse backend: {meta['xfuse_backend']}"
        + (", QUICK mode" if meta["quick"] else ""),
        "libraries: " + ", ".join(f"{k} {v}" for k, v in meta.get("library_versions", {}).items()),
        "",
        "Median time per call; 'xfuse vs jax' is the speed-up over jax.jit (jax.jit time / xfuse "
        "time, above 1x is faster)."
        + (f" Each engine ran in {processes} processes, in turns." if processes > 1 else ""),
        "Kernels: xfuse's compiled.kernel_count(); XLA's compute instructions of the optimised "
        "ENTRY computation (a loop counts once). Steps/call: what xfuse's runtime runs in Python "
        "per call, loop iterations it runs itself included.",
        "First result: a fresh jit's first call (trace, compile, run) in a fresh process, xfuse "
        "with an empty kernel cache and its tiers (the first calls run on jax.jit's executable "
        "while the native program compiles); 'xfuse native': until the native program is ready; "
        "'xfuse cached': a second xfuse.jit of the program in that process, its kernels in the "
        "cache.",
        "",
        _grid(header, rows, left=2),
        "",
        *([process_table(results), ""] if processes > 1 else []),
        _load_line(meta),
    ]
    for engine, summary in results["summary"].items():
        lines.append(
            f"geometric mean speed-up of {LABELS[engine]} over jax.jit: "
            f"{ratio(summary['geomean_speedup_vs_jax'])} over {summary['workloads_counted']} of "
            f"{summary['workloads_run']} programs (the others failed or were wrong)"
        )
    return "\n".join(lines + _notes(notes))


def _program_error(result: dict) -> str:
    """A corpus program's failure: the stage, the error, or the first mismatching leaf."""
    text = str(result.get("error"))
    if result.get("failed_at"):
        text = f"at {result['failed_at']}: {text}"
    check = result.get("check") or {}
    if not check.get("ok", True):
        if not check.get("structure_ok", True):
            text += f" (output structure differs: {check.get('structure')})"
        elif check.get("first_mismatch"):
            leaf = check["first_mismatch"]
            text += (f" ({check['mismatched_leaves']} of {check['leaves']} leaves differ; "
                     f"first {leaf['path']} {leaf['dtype']}{leaf['shape']}: "
                     f"max abs error {leaf.get('max_abs_err', float('nan')):.3g}, "
                     f"got {leaf.get('worst_got')} for {leaf.get('worst_want')})")
    return text


def _machine(machine: dict) -> str:
    """'AMD EPYC (2 cores, znver3, AVX2)': the core and vector extension where recorded."""
    details = [f"{machine['cores']} cores", machine.get("core"), machine.get("simd")]
    return f"{machine['cpu']} ({', '.join(d for d in details if d)})"


def rows_of(results: dict) -> list[dict]:
    """The rows of a run: its corpus programs', or its workloads'."""
    return results["programs"] if "programs" in results else results["workloads"]


def process_table(results: dict) -> str:
    """Each engine's median time in each of its timing processes, in the order they ran."""
    engines = results["meta"]["engines"]
    rows = []
    for row in rows_of(results):
        cells = [row["name"]]
        for engine in engines:
            times = (row["engines"].get(engine) or {}).get("process_times_s")
            cells.append("n/a" if not times else " / ".join(seconds(t) for t in times))
        rows.append(cells)
    header = ["time per process", *(LABELS[e] for e in engines)]
    return _grid(header, rows)


def _load_line(meta: dict) -> str:
    before, after = meta.get("load_average_before"), meta.get("load_average_after")
    if not before:
        return "load average: unknown"
    text = f"load average (1 min) before/after the run: {before[0]:.2f} / {after[0]:.2f}"
    cores = meta["machine"].get("cores") or 1
    if before[0] > 0.5 * cores or after[0] > cores:  # the suite itself keeps about one busy
        text += "  -- the machine was busy with other work; timings are pessimistic"
    return text


def _error_text(result: dict) -> str:
    text = str(result.get("error"))
    check = result.get("check")
    if check and not check.get("ok"):
        text += (
            f" (max abs error {check['max_abs_err']:.3g}, tolerance {check['tolerance']:.3g}, "
            f"dtype {check['dtype']}, shape ok: {check['shape_ok']})"
        )
    return text


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:.0f}"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _megabytes(value: int) -> str:
    if value < 2**20:
        return f"{value / 1024:.3g} KiB"
    return f"{value / 2**20:.3g} MiB"


# --------------------------------------------------------------------------- chart


def chart_series(results: dict) -> tuple[list[str], dict[str, list[float | None]]]:
    """Workload names and, per engine other than jax, its speed-up over jax.jit (None: none)."""
    engines = [e for e in results["meta"]["engines"] if e != "jax"]
    names = [row["name"] for row in rows_of(results)]
    series = {
        LABELS[e]: [row["speedup_vs_jax"].get(e) for row in rows_of(results)] for e in engines
    }
    return names, series


def chart(results: dict, path: Path) -> str:
    """Draws the speed-up bar chart at `path`; returns how it was drawn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names, series = chart_series(results)
    title = f"speed-up over jax.jit ({results['meta']['date']}, {results['meta']['machine']['cpu']})"
    try:
        import matplotlib
    except ImportError:
        from .png import bar_chart

        bar_chart(path, names, series, title)
        return f"{path} (drawn without matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(12, 5.5), layout="constrained")
    width = 0.8 / max(1, len(series))
    for index, (label, values) in enumerate(series.items()):
        xs = [i + (index - (len(series) - 1) / 2) * width for i in range(len(names))]
        heights = [v - 1.0 if v else 0.0 for v in values]  # bars grow up or down from 1x
        axes.bar(xs, heights, width, bottom=1.0, label=label)
        for x, v in zip(xs, values):
            text = "n/a" if v is None else f"{v:.2g}"
            where = "bottom" if (v or 1.0) >= 1.0 else "top"
            axes.text(x, v or 1.0, text, ha="center", va=where, fontsize=6)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_yscale("log")
    axes.set_ylabel("speed-up over jax.jit (log scale)")
    axes.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    axes.set_title(title, fontsize=10)
    axes.legend()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return str(path)
