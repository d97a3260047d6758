"""Dead code elimination: before/expected modules in HLO text."""

from xfuse.fusion.dce import DeadCodeElimination
from xfuse.fusion.pipeline import REGISTRY

from .helpers import assert_pass, assert_unchanged

DCE = DeadCodeElimination()


def test_registered():
    assert REGISTRY["dce"] is DeadCodeElimination
    assert DCE.name == "dce"


def test_removes_what_the_root_does_not_reach():
    assert_pass(
        DCE,
        """
HloModule m

ENTRY main (x: f32[4], y: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  dead.0 = f32[4] exp(x)
  dead.1 = f32[4] add(dead.0, y)
  live = f32[4] neg(x), loc="model.py:3 (f)"
  ROOT out = f32[4] mul(live, x), loc="model.py:4 (f)"
}
""",
        """
HloModule m

ENTRY main (x: f32[4], y: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  live = f32[4] neg(x), loc="model.py:3 (f)"
  ROOT out = f32[4] mul(live, x), loc="model.py:4 (f)"
}
""",
    )


def test_keeps_unused_parameters_and_a_parameter_root():
    assert_pass(
        DCE,
        """
HloModule m

ENTRY main (a: s32[], b: s32[2]) -> s32[2] {
  a = s32[] parameter(0)
  dead = s32[] neg(a)
  ROOT b = s32[2] parameter(1)
}
""",
        """
HloModule m

ENTRY main (a: s32[], b: s32[2]) -> s32[2] {
  a = s32[] parameter(0)
  ROOT b = s32[2] parameter(1)
}
""",
    )


def test_keeps_the_operands_of_a_tuple_root():
    assert_unchanged(
        DCE,
        """
HloModule m

ENTRY main (x: f32[2]) -> (f32[2], f32[2]) {
  x = f32[2] parameter(0)
  e = f32[2] exp(x)
  ROOT t = (f32[2], f32[2]) tuple(e, x)
}
""",
    )


def test_removes_computations_no_longer_called():
    assert_pass(
        DCE,
        """
HloModule m

inner (q: f32[3]) -> f32[3] {
  q = f32[3] parameter(0)
  ROOT l = f32[3] log(q)
}

fused_exp (p: f32[3]) -> f32[3] {
  p = f32[3] parameter(0)
  e = f32[3] exp(p)
  ROOT c = f32[3] call(e), calls=inner
}

fused_neg (p: f32[3]) -> f32[3] {
  p = f32[3] parameter(0)
  ROOT n = f32[3] neg(p)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  dead = f32[3] fusion(x), kind=loop, calls=fused_exp
  ROOT live = f32[3] fusion(x), kind=loop, calls=fused_neg
}
""",
        """
HloModule m

fused_neg (p: f32[3]) -> f32[3] {
  p = f32[3] parameter(0)
  ROOT n = f32[3] neg(p)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  ROOT live = f32[3] fusion(x), kind=loop, calls=fused_neg
}
""",
    )


def test_cleans_called_computations_but_keeps_their_parameters():
    assert_pass(
        DCE,
        """
HloModule m

fused (p0: f32[3], p1: f32[3]) -> f32[3] {
  p0 = f32[3] parameter(0)
  p1 = f32[3] parameter(1)
  unused = f32[3] add(p0, p1)
  ROOT n = f32[3] neg(p0)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  ROOT f = f32[3] fusion(x, x), kind=loop, calls=fused
}
""",
        """
HloModule m

fused (p0: f32[3], p1: f32[3]) -> f32[3] {
  p0 = f32[3] parameter(0)
  p1 = f32[3] parameter(1)
  ROOT n = f32[3] neg(p0)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  ROOT f = f32[3] fusion(x, x), kind=loop, calls=fused
}
""",
    )


def test_unused_computation_is_removed_even_when_never_called():
    assert_pass(
        DCE,
        """
HloModule m

orphan (p: f32[]) -> f32[] {
  ROOT p = f32[] parameter(0)
}

ENTRY main (x: f32[]) -> f32[] {
  ROOT x = f32[] parameter(0)
}
""",
        """
HloModule m

ENTRY main (x: f32[]) -> f32[] {
  ROOT x = f32[] parameter(0)
}
""",
    )


def test_nothing_dead_returns_the_same_module():
    assert_unchanged(
        DCE,
        """
HloModule m

fused (p: f32[3]) -> f32[3] {
  p = f32[3] parameter(0)
  ROOT n = f32[3] neg(p)
}

ENTRY main (x: f32[3], unused: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  unused = f32[3] parameter(1)
  a = f32[3] fusion(x), kind=loop, calls=fused
  ROOT b = f32[3] call(a), calls=fused
}
""",
    )
