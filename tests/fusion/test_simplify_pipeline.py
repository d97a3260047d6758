"""The simplification passes through the pass manager: pipeline strings, unknown names, per-pass
dumps that parse back, and a failing pass reported with the passes that ran before it."""

from dataclasses import dataclass
from typing import ClassVar

import pytest

from xfuse.fusion.algebraic import AlgebraicSimplifier
from xfuse.fusion.constant_folding import ConstantFolding
from xfuse.fusion.cse import CommonSubexpressionElimination
from xfuse.fusion.dce import DeadCodeElimination
from xfuse.fusion.pipeline import PassError, parse_pipeline, run_pipeline
from xfuse.hlo import Instruction, Module, Op, parse, verify

from .helpers import assert_same_results, input_sets

TEXT = """
HloModule pipeline_demo

ENTRY main (x: f32[4], y: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  c = f32[] constant(1.0)
  one = f32[4] broadcast_in_dim(c), dims={}
  two = f32[] constant(2.0)
  four = f32[] mul(two, two), loc="model.py:2 (f)"
  four_b = f32[4] broadcast_in_dim(four), dims={}
  m = f32[4] mul(x, one), loc="model.py:3 (f)"
  a.0 = f32[4] add(m, y), loc="model.py:4 (f)"
  a.1 = f32[4] add(y, x), loc="model.py:5 (f)"
  s = f32[4] mul(a.0, four_b), loc="model.py:6 (f)"
  ROOT r = f32[4] sub(s, a.1), loc="model.py:7 (f)"
}
"""

EXPECTED = """
HloModule pipeline_demo

ENTRY main (x: f32[4], y: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  four = f32[] constant(4.0), loc="model.py:2 (f)"
  four_b = f32[4] broadcast_in_dim(four), dims={}
  a.0 = f32[4] add(x, y), loc="model.py:4 (f)"
  s = f32[4] mul(a.0, four_b), loc="model.py:6 (f)"
  ROOT r = f32[4] sub(s, a.0), loc="model.py:7 (f)"
}
"""


def test_pipeline_strings_name_the_passes_in_order():
    passes = parse_pipeline("simplify, cse,dce")
    assert [type(p) for p in passes] == [
        AlgebraicSimplifier,
        CommonSubexpressionElimination,
        DeadCodeElimination,
    ]
    fold, simplify = parse_pipeline("fold,simplify")
    assert isinstance(fold, ConstantFolding) and isinstance(simplify, AlgebraicSimplifier)
    assert (fold.name, simplify.name) == ("fold", "simplify")


def test_unknown_pass_names_are_named_in_the_error():
    with pytest.raises(ValueError) as info:
        parse_pipeline("simplify,simplfy,cse,bogus")
    message = str(info.value)
    assert "simplfy" in message and "bogus" in message
    assert "simplify" in message.split("known:")[1]  # the known passes are listed


def test_the_simplification_pipeline_end_to_end():
    before = parse(TEXT)
    result = run_pipeline(before, parse_pipeline("simplify,fold,cse,dce"), verify_passes=True)
    assert str(result.module) == str(parse(EXPECTED))
    assert [r.name for r in result.history] == ["simplify", "fold", "cse", "dce"]
    assert all(r.changed for r in result.history)
    assert_same_results(before, result.module, input_sets(before))
    again = run_pipeline(result.module, parse_pipeline("simplify,fold,cse,dce"))
    assert again.module is result.module
    assert not any(r.changed for r in again.history)


def test_per_pass_dumps_parse_back(tmp_path):
    module = parse(TEXT)
    result = run_pipeline(module, parse_pipeline("simplify,fold,cse,dce"), dump_to=tmp_path)
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps == [
        "pipeline_demo.00_input.hlo",
        "pipeline_demo.01_simplify.hlo",
        "pipeline_demo.02_fold.hlo",
        "pipeline_demo.03_cse.hlo",
        "pipeline_demo.04_dce.hlo",
        "pipeline_demo.final.hlo",
    ]
    for record, number in zip(result.history, range(1, 5)):
        text = (tmp_path / f"pipeline_demo.{number:02d}_{record.name}.hlo").read_text()
        dumped = parse(text)
        verify(dumped)
        assert dumped == record.module
    assert parse((tmp_path / "pipeline_demo.final.hlo").read_text()) == result.module


@dataclass(frozen=True, slots=True)
class Explodes:
    name: ClassVar[str] = "explodes"

    def run(self, module: Module) -> Module:
        raise RuntimeError("kaboom")


@dataclass(frozen=True, slots=True)
class Corrupts:
    """Makes the root read a name that does not exist."""

    name: ClassVar[str] = "corrupts"

    def run(self, module: Module) -> Module:
        entry = module.entry_computation
        root = entry.root_instruction
        broken = Instruction(root.name, Op.NEG, root.shape, ("nowhere",), (), root.loc)
        instructions = tuple(broken if i.name == root.name else i for i in entry.instructions)
        return module.with_computation(entry.replace(instructions=instructions))


def test_a_failing_pass_is_reported_with_the_passes_before_it():
    passes = [*parse_pipeline("simplify,cse"), Explodes(), DeadCodeElimination()]
    with pytest.raises(PassError, match=r"pass 'explodes' failed \(after simplify, cse\).*kaboom"):
        run_pipeline(parse(TEXT), passes)
    with pytest.raises(PassError, match=r"pass 'explodes' failed \(the first pass\)"):
        run_pipeline(parse(TEXT), [Explodes()])


def test_a_pass_producing_an_invalid_module_is_reported():
    passes = [*parse_pipeline("fold,dce"), Corrupts()]
    wanted = r"'corrupts' produced an invalid module \(after fold, dce\)"
    with pytest.raises(PassError, match=wanted):
        run_pipeline(parse(TEXT), passes, verify_passes=True)
