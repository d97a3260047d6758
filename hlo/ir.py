"""The immutable IR: `Loc`, `Instruction`, `Computation` (topologically ordered, one root) and
`Module` (an entry computation plus the computations it calls).

Operands are referred to by name within their computation, so instructions are plain values:
they compare, hash and print without identity. Passes build new computations rather than
mutating. Imports numpy-free modules of this package only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from .dtypes import AnyShape, Shape
from .ops import AttrKind, Op, OpInfo

_LOC_RE = re.compile(
    r"(?P<file>.*):(?P<line>-?\d+)(?: \((?P<function>.*)\))?", re.DOTALL | re.ASCII
)
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*", re.ASCII)


@dataclass(frozen=True, slots=True)
class Loc:
    """Where an instruction came from in the user's source: file, line and function."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        text = f"{self.file}:{self.line}"
        return f"{text} ({self.function})" if self.function else text

    @staticmethod
    def parse(text: str) -> Loc:
        match = _LOC_RE.fullmatch(text)
        if not match:
            raise ValueError(f"expected file:line or file:line (function), got {text!r}")
        return Loc(match["file"], int(match["line"]), match["function"] or "")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One SSA value: `name = shape op(operands), attrs`.

    `attrs` holds every attribute of the op's schema, in schema order, defaults filled in.
    """

    name: str
    op: Op
    shape: AnyShape
    operands: tuple[str, ...] = ()
    attrs: tuple[tuple[str, object], ...] = ()
    loc: Loc | None = None

    @property
    def info(self) -> OpInfo:
        return self.op.info

    def attr(self, name: str) -> object:
        for key, value in self.attrs:
            if key == name:
                return value
        raise KeyError(f"{self.name} ({self.op}) has no attribute {name!r}")

    @property
    def attributes(self) -> dict[str, object]:
        return dict(self.attrs)

    @property
    def array_shape(self) -> Shape:
        if not isinstance(self.shape, Shape):
            raise TypeError(f"{self.name} has tuple shape {self.shape}")
        return self.shape

    @property
    def called(self) -> str | None:
        """The name of the computation a fusion or call invokes, else None."""
        return self.attr("calls") if self.op in (Op.FUSION, Op.CALL) else None

    @property
    def callees(self) -> tuple[str, ...]:
        """Every computation this instruction invokes, in attribute order: a fusion's or call's
        body, a while's condition and body, a conditional's branches."""
        specs = self.op.info.attr_index
        names: list[str] = []
        for key, value in self.attrs:
            spec = specs.get(key)
            if spec is None:
                continue
            if spec.kind is AttrKind.NAME and isinstance(value, str):
                names.append(value)
            elif spec.kind is AttrKind.NAMES and isinstance(value, tuple):
                names.extend(v for v in value if isinstance(v, str))
        return tuple(names)

    def replace(self, **changes: object) -> Instruction:
        fields = {
            "name": self.name,
            "op": self.op,
            "shape": self.shape,
            "operands": self.operands,
            "attrs": self.attrs,
            "loc": self.loc,
        }
        fields.update(changes)
        return Instruction(**fields)


@dataclass(frozen=True, slots=True)
class Computation:
    """A function: instructions in topological order, parameters among them, one root."""

    name: str
    instructions: tuple[Instruction, ...]
    root: str
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "instructions", tuple(self.instructions))
        index = {inst.name: i for i, inst in enumerate(self.instructions)}
        object.__setattr__(self, "_index", MappingProxyType(index))

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> Instruction:
        return self.instructions[self._index[name]]

    def get(self, name: str) -> Instruction | None:
        i = self._index.get(name)
        return None if i is None else self.instructions[i]

    @property
    def root_instruction(self) -> Instruction:
        return self[self.root]

    @property
    def parameters(self) -> list[Instruction]:
        """The parameters, ordered by their index."""
        params = [i for i in self.instructions if i.op is Op.PARAMETER]
        return sorted(params, key=lambda p: p.attr("index"))

    @property
    def parameter_shapes(self) -> list[AnyShape]:
        return [p.shape for p in self.parameters]

    @property
    def result_shape(self) -> AnyShape:
        return self.root_instruction.shape

    def users(self) -> dict[str, list[str]]:
        """For each instruction, the names of the instructions that read it (in order, once)."""
        result: dict[str, list[str]] = {i.name: [] for i in self.instructions}
        for inst in self.instructions:
            for operand in dict.fromkeys(inst.operands):
                if operand in result:
                    result[operand].append(inst.name)
        return result

    def replace(self, **changes: object) -> Computation:
        fields = {"name": self.name, "instructions": self.instructions, "root": self.root}
        fields.update(changes)
        return Computation(**fields)


@dataclass(frozen=True, slots=True)
class Module:
    """A program: computations in definition order (callees before callers) and an entry."""

    name: str
    computations: tuple[Computation, ...]
    entry: str
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "computations", tuple(self.computations))
        index = {c.name: i for i, c in enumerate(self.computations)}
        object.__setattr__(self, "_index", MappingProxyType(index))

    def __str__(self) -> str:
        from .printer import print_module

        return print_module(self)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> Computation:
        return self.computations[self._index[name]]

    def get(self, name: str) -> Computation | None:
        i = self._index.get(name)
        return None if i is None else self.computations[i]

    @property
    def entry_computation(self) -> Computation:
        return self[self.entry]

    def replace(self, **changes: object) -> Module:
        fields = {"name": self.name, "computations": self.computations, "entry": self.entry}
        fields.update(changes)
        return Module(**fields)

    def with_computation(self, computation: Computation) -> Module:
        """This module with `computation` replacing the one of the same name (or added first)."""
        if computation.name in self._index:
            comps = [computation if c.name == computation.name else c for c in self.computations]
        else:
            comps = [computation, *self.computations]
        return self.replace(computations=tuple(comps))

    @staticmethod
    def of(entry: Computation, *called: Computation, name: str | None = None) -> Module:
        """A module with `entry` and the computations it calls, callees before their callers."""
        return Module(name or entry.name, (*callees_first(called), entry), entry.name)


def callees_first(computations: Sequence[Computation]) -> list[Computation]:
    """`computations` reordered so each comes after those among them it calls (otherwise in
    the order given; a call cycle, which the verifier rejects, keeps its given order)."""
    by_name = {c.name: c for c in computations}
    order: list[Computation] = []
    state: dict[str, int] = {}  # 1: being visited, 2: placed

    def visit(comp: Computation) -> None:
        if state.get(comp.name):
            return
        state[comp.name] = 1
        for inst in comp.instructions:
            for name in inst.callees:
                if name in by_name:
                    visit(by_name[name])
        state[comp.name] = 2
        order.append(comp)

    for comp in computations:
        visit(comp)
    return order


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base.1`, `base.2`, ... : the first not in `taken`, which it joins."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}.{n}"
    taken.add(name)
    return name


def operand_instructions(comp: Computation, inst: Instruction) -> Sequence[Instruction]:
    return [comp[o] for o in inst.operands]
