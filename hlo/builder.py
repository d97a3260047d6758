"""`Builder`: builds one computation an instruction at a time, applying each op's shape rule at
the call and naming results after their op (`add.3`). Every op is a method named after it
(`b.add(x, y)`, `b.dot_general(x, w, contracting=((1,), (0,)))`); ops whose result is declared
rather than derived take `shape=` (or `dtype=` for convert_element_type and dot_general).
Invalid calls raise `BuilderError` naming the op and the operand shapes. Imports this package only.
"""

from __future__ import annotations

from collections.abc import Sequence

from .dtypes import AnyShape, DType, Shape
from .errors import BuilderError
from .ir import Computation, Instruction, Loc
from .literal import Literal
from .ops import OPS_BY_NAME, REQUIRED, AttrKind, Op
from .shape_rules import ShapeError

Value = Instruction | str


class Builder:
    """Builds a `Computation`. Values are the `Instruction`s returned by each call."""

    def __init__(self, name: str, loc: Loc | None = None) -> None:
        self.name = name
        self.loc = loc  # the default location of new instructions
        self._instructions: list[Instruction] = []
        self._by_name: dict[str, Instruction] = {}
        self._counter = 0
        self._parameters = 0

    # ------------------------------------------------------------------ naming
    def fresh_name(self, base: str) -> str:
        while True:
            name = f"{base}.{self._counter}"
            self._counter += 1
            if name not in self._by_name:
                return name

    def _add(self, inst: Instruction) -> Instruction:
        if inst.name in self._by_name:
            raise BuilderError(f"{self.name}: the name {inst.name!r} is already used")
        self._instructions.append(inst)
        self._by_name[inst.name] = inst
        return inst

    def _resolve(self, value: Value) -> Instruction:
        name = value if isinstance(value, str) else value.name
        inst = self._by_name.get(name)
        if inst is None:
            raise BuilderError(f"{self.name}: {name!r} is not an instruction of this computation")
        return inst

    # ------------------------------------------------------------------ leaves
    def parameter(self, shape: AnyShape, name: str | None = None, index: int | None = None) -> Instruction:
        index = self._parameters if index is None else index
        self._parameters = max(self._parameters, index + 1)
        inst = Instruction(
            name or f"p{index}", Op.PARAMETER, shape, (), (("index", index),), self.loc
        )
        return self._add(inst)

    def constant(self, value: object, dtype: DType | None = None, name: str | None = None) -> Instruction:
        literal = value if isinstance(value, Literal) else Literal(value, dtype)
        inst = Instruction(
            name or self.fresh_name("constant"),
            Op.CONSTANT,
            literal.shape,
            (),
            (("value", literal),),
            self.loc,
        )
        return self._add(inst)

    # ------------------------------------------------------------------ every other op
    def emit(
        self,
        op: Op,
        *operands: Value,
        shape: AnyShape | Sequence[int] | None = None,
        dtype: DType | None = None,
        name: str | None = None,
        loc: Loc | None = None,
        **attrs: object,
    ) -> Instruction:
        """Adds `op(operands)` with `attrs`; `shape`/`dtype` declare the result where needed."""
        if op in (Op.PARAMETER, Op.CONSTANT):
            raise BuilderError(f"use Builder.{op.value}() for {op}")
        info = op.info
        insts = [self._resolve(v) for v in operands]
        shapes = [i.shape for i in insts]
        described = f"{op}({', '.join(str(s) for s in shapes)})"
        if info.arity is not None and len(insts) != info.arity:
            raise BuilderError(f"{described}: {op} takes {info.arity} operands, got {len(insts)}")
        if info.arity is None and len(insts) < info.min_arity:
            raise BuilderError(f"{described}: {op} takes at least {info.min_arity} operands")
        values = self._attrs(op, attrs, described)
        if op in (Op.ARGMAX, Op.ARGMIN) and shape is None and shapes:  # dims lose the axis
            dims = shapes[0].dims if isinstance(shapes[0], Shape) else ()
            shape = tuple(d for i, d in enumerate(dims) if i != values["axis"])
        declared = self._declared(shapes, shape, dtype, described)
        try:
            result = info.shape(shapes, values, declared)
        except ShapeError as e:
            raise BuilderError(f"{described}: {e}") from None
        inst = Instruction(
            name or self.fresh_name(op.value),
            op,
            result,
            tuple(i.name for i in insts),
            tuple((spec.name, values[spec.name]) for spec in info.attrs),
            loc or self.loc,
        )
        return self._add(inst)

    @staticmethod
    def _declared(shapes, shape, dtype, described) -> AnyShape | None:
        if shape is not None and not isinstance(shape, (Shape,)) and not hasattr(shape, "elements"):
            if dtype is None:
                dtype = shapes[0].dtype if shapes and isinstance(shapes[0], Shape) else None
            if dtype is None:
                raise BuilderError(f"{described}: give dtype= with a dimensions-only shape")
            return Shape(dtype, tuple(shape))
        if shape is None and dtype is not None:
            dims = shapes[0].dims if shapes and isinstance(shapes[0], Shape) else ()
            return Shape(dtype, dims)
        return shape

    @staticmethod
    def _attrs(op: Op, given: dict[str, object], described: str) -> dict[str, object]:
        info = op.info
        unknown = set(given) - set(info.attr_index)
        if unknown:
            raise BuilderError(f"{described}: unknown attribute(s) {sorted(unknown)}")
        values: dict[str, object] = {}
        for spec in info.attrs:
            value = given.get(spec.name, spec.default)
            if value is REQUIRED:
                raise BuilderError(f"{described}: missing attribute {spec.name!r}")
            if spec.kind is AttrKind.INTS:
                value = tuple(int(v) for v in value)
            elif spec.kind is AttrKind.INTS_PAIR:
                value = tuple(tuple(int(v) for v in side) for side in value)
                if len(value) != 2:
                    raise BuilderError(f"{described}: {spec.name} needs (lhs, rhs) dimensions")
            elif spec.kind is AttrKind.INT:
                value = int(value)
            elif spec.kind is AttrKind.NAMES:
                value = (value,) if isinstance(value, str) else tuple(value)
            elif spec.kind is AttrKind.ENUM and value not in spec.choices:
                raise BuilderError(f"{described}: {spec.name} must be one of {spec.choices}")
            values[spec.name] = value
        return values

    def __getattr__(self, attr: str):
        """`b.add(x, y)` is `b.emit(Op.ADD, x, y)`; `b.and_`/`b.not_` for the Python keywords."""
        op = OPS_BY_NAME.get(attr.rstrip("_"))
        if op is None or attr.startswith("__"):
            raise AttributeError(attr)
        return lambda *operands, **kw: self.emit(op, *operands, **kw)

    # ------------------------------------------------------------------ result
    def build(self, root: Value | Sequence[Value]) -> Computation:
        """The computation with `root` as its result; a sequence makes a tuple root."""
        if isinstance(root, (list, tuple)):
            root = self.emit(Op.TUPLE, *root)
        return Computation(self.name, tuple(self._instructions), self._resolve(root).name)
