"""The notebooks run: each committed notebook is executed again (a copy in memory; the committed
file keeps its outputs), and any error in any cell fails the test."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ["01_fusion_tour.ipynb", "02_performance.ipynb", "03_aot.ipynb"]


def test_every_notebook_is_listed():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    committed = [c for c in nb.cells if c.cell_type == "code"]
    assert committed and all(c.outputs for c in committed), f"{name}: committed without outputs"
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError naming the cell on any error
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{name}: {output.ename}: {output.evalue}"
    if name == "01_fusion_tour.ipynb":  # the compiled function drew itself: graph and report
        rich = [o for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
        assert any('class="cluster"' in o.data["text/html"] for o in rich)
