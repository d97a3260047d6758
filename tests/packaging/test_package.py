"""Packaging and layering: the folders install as subpackages of `xfuse` (no generic top-level
names in site-packages), the console script runs the demo, and `xfuse.hlo` stands alone."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_FOLDERS = ("hlo", "frontend", "fusion", "backends", "aot", "runtime")


def test_wheel_maps_every_folder_under_xfuse(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("xfuse-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top_level == {"xfuse"}
    for folder in CODE_FOLDERS:
        assert f"xfuse/{folder}/__init__.py" in names
    assert "xfuse/hlo/parser.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert re.search(r"xfuse\s*=\s*xfuse\.cli:main", text)


def test_demo_runs_from_the_console_script():
    result = subprocess.run(["xfuse", "demo"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "ROOT" in result.stdout
    assert "structurally equal, same text; verified" in result.stdout
    assert "(ok)" in result.stdout


def test_hlo_imports_nothing_but_numpy():
    code = (
        "import sys, xfuse.hlo\n"
        "bad = [m for m in ('jax', 'jaxlib', 'numba', 'llvmlite', 'networkx', 'xfuse.frontend',"
        " 'xfuse.fusion', 'xfuse.backends', 'xfuse.runtime', 'xfuse.aot') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hlo_sources_import_only_numpy_and_themselves():
    allowed = {"numpy", "ml_dtypes", "__future__"}
    stdlib = set(sys.stdlib_module_names)
    for path in (ROOT / "hlo").glob("*.py"):
        for match in re.finditer(r"^\s*(?:from|import)\s+([\w.]+)", path.read_text(), re.M):
            module = match.group(1)
            if module.startswith("."):
                continue
            top = module.split(".")[0]
            assert top in allowed or top in stdlib, f"{path.name} imports {module}"
