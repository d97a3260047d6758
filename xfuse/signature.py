"""Call signatures: splitting static from dynamic arguments, flattening pytrees, and the
abstract key (shapes, dtypes, weak types, static values, tree structure) that selects a
compiled executable. Dtypes are canonicalised as jax.jit does (float64 -> float32 unless x64).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from xfuse.hlo import DType, Shape


@dataclass(frozen=True, slots=True)
class LeafSpec:
    """One flat argument: where it sits in the pytree, its type, and whether it is weak."""

    path: str
    shape: Shape
    weak: bool = False

    def __str__(self) -> str:
        return f"{self.shape}{' (weak)' if self.weak else ''}"

    @property
    def struct(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape.dims, self.shape.dtype.numpy, weak_type=self.weak)


def _canonical(dtype: np.dtype) -> np.dtype:
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def abstractify(leaf: object, path: str) -> LeafSpec:
    """The LeafSpec of one argument: an array (numpy or jax), numpy scalar or Python scalar."""
    if isinstance(leaf, (bool, int, float)) and not isinstance(leaf, np.generic):
        # Python scalars are weakly typed, as in jax (bool excepted).
        if isinstance(leaf, bool):
            return LeafSpec(path, Shape(DType.PRED, ()), False)
        dtype = _canonical(np.dtype(np.int64 if isinstance(leaf, int) else np.float64))
        if isinstance(leaf, int) and not np.iinfo(dtype).min <= leaf <= np.iinfo(dtype).max:
            raise OverflowError(f"argument {path}: Python int {leaf} does not fit in {dtype}")
        return LeafSpec(path, Shape(DType.from_numpy(dtype), ()), True)
    if isinstance(leaf, (str, bytes)):
        raise TypeError(f"argument {path}: {type(leaf).__name__} is not an array")
    if isinstance(leaf, complex):
        raise TypeError(f"argument {path}: complex numbers are not supported by xfuse")
    dtype = getattr(leaf, "dtype", None)
    shape = getattr(leaf, "shape", None)
    if dtype is None or shape is None:
        try:
            array = np.asarray(leaf)
        except Exception as e:
            raise TypeError(f"argument {path}: {type(leaf).__name__} is not an array") from e
        if array.dtype == object:
            raise TypeError(f"argument {path}: {type(leaf).__name__} is not an array")
        dtype, shape = array.dtype, array.shape
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        raise TypeError(f"argument {path}: a typed PRNG key array ({dtype}); pass its key data "
                        "(jax.random.key_data(key)) or a jax.random.PRNGKey, which xfuse takes as uint32")
    try:
        dtype = np.dtype(dtype)
        if dtype.byteorder not in "=|" and dtype.kind in "biuf":  # non-native: read as native
            dtype = dtype.newbyteorder("=")
        xdtype = DType.from_numpy(_canonical(dtype))
    except TypeError:
        raise TypeError(f"argument {path}: dtype {dtype} is not supported by xfuse") from None
    weak = bool(getattr(leaf, "weak_type", False))
    return LeafSpec(path, Shape(xdtype, tuple(int(d) for d in shape)), weak)


def to_array(leaf: object, spec: LeafSpec, device_arrays: bool = False) -> np.ndarray:
    """The argument as a numpy array of its canonical dtype (no copy when it already is one).
    `device_arrays`: a jax array of that dtype stays as it is, on its device (for a backend
    that takes them: a GPU's arrays do not come back to the host)."""
    if device_arrays and isinstance(leaf, jax.Array) and leaf.dtype == spec.shape.dtype.numpy:
        return leaf
    try:
        array = np.asarray(leaf, dtype=spec.shape.dtype.numpy)
    except (TypeError, ValueError) as e:  # an object that claims a shape and dtype, but is no array
        raise TypeError(f"argument {spec.path}: {type(leaf).__name__} is not an array ({e})") from e
    if array.shape != spec.shape.dims:
        raise TypeError(f"argument {spec.path}: {type(leaf).__name__} says its shape is "
                        f"{tuple(spec.shape.dims)} but converts to an array of shape {array.shape}")
    return array


def leaf_paths(
    args: tuple, kwargs: dict, arg_names: Sequence[str]
) -> tuple[list[object], list[str], object]:
    """Leaves of (args, kwargs), their paths as the user would write them (`x`,
    `params['w']`), and the tree structure; `arg_names` names the positional arguments."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs))
    leaves = [leaf for _, leaf in with_paths]
    paths = [_path_text(path, arg_names) for path, _ in with_paths]
    return leaves, paths, treedef


_LEAF = object()


def structure_mismatch(in_tree, args: tuple, kwargs: dict, splitter: ArgumentSplitter) -> str:
    """Where a call's dynamic (args, kwargs) departs from the pytree structure `in_tree`,
    naming the argument: `argument params should be {'b': *, 'w': *}, got {'w': *}`."""
    want_args, want_kwargs = jax.tree_util.tree_unflatten(in_tree, [_LEAF] * in_tree.num_leaves)
    count = max(len(args), len(want_args)) + len(splitter.static_argnums)
    names = splitter.dynamic_names(count)
    if len(args) != len(want_args):
        return (f"takes {len(want_args)} array arguments ({', '.join(names[: len(want_args)])}), "
                f"got {len(args)}")
    if sorted(kwargs) != sorted(want_kwargs):
        return f"takes the keyword arguments {sorted(want_kwargs)}, got {sorted(kwargs)}"
    pairs = [*zip(names, want_args, args), *((k, want_kwargs[k], kwargs[k]) for k in sorted(kwargs))]
    for name, want, got in pairs:
        want_tree, got_tree = jax.tree_util.tree_structure(want), jax.tree_util.tree_structure(got)
        if want_tree != got_tree:
            return f"argument {name} should be {_structure_text(want_tree)}, got {_structure_text(got_tree)}"
    return f"the arguments' structure does not match {in_tree}"


def _structure_text(tree) -> str:
    if tree.num_leaves == 1 and jax.tree_util.treedef_is_leaf(tree):
        return "an array"
    text = str(tree)
    return text[len("PyTreeDef("):-1] if text.startswith("PyTreeDef(") else text


def _path_text(path, arg_names: Sequence[str]) -> str:
    top, first, *rest = path  # (args, kwargs)[top][first]...
    if top.idx == 0:
        base = arg_names[first.idx] if first.idx < len(arg_names) else f"args[{first.idx}]"
    else:
        base = str(first.key)
    return base + "".join(str(k) for k in rest)


class ArgumentSplitter:
    """Separates static from dynamic arguments as jax.jit does, by position and by name."""

    def __init__(self, fun: Callable, static_argnums: Sequence[int], static_argnames: Sequence[str]):
        self.names: list[str] | None = None
        try:
            parameters = list(inspect.signature(fun).parameters.values())
            positional = [
                p.name for p in parameters
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            self.names = positional
        except (TypeError, ValueError):  # builtins, some callables
            positional = []
        nums = {int(n) for n in static_argnums}
        names = set(static_argnames)
        for n in list(nums):
            if 0 <= n < len(positional):
                names.add(positional[n])
        for name in list(names):
            if name in positional:
                nums.add(positional.index(name))
        self.static_argnums = frozenset(nums)
        self.static_argnames = frozenset(names)
        self.has_static = bool(nums or names)

    def split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple[Hashable, ...]]:
        """(dynamic args, dynamic kwargs, static key) for one call."""
        nargs = len(args)
        static_positions = {n if n >= 0 else n + nargs for n in self.static_argnums}
        dynamic_args = tuple(a for i, a in enumerate(args) if i not in static_positions)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        static = tuple(
            (f"args[{i}]", args[i]) for i in sorted(static_positions) if 0 <= i < nargs
        ) + tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
        for where, value in static:
            try:
                hash(value)
            except TypeError:
                raise ValueError(
                    f"static argument {where} must be hashable, got {type(value).__name__}"
                ) from None
        return dynamic_args, dynamic_kwargs, static

    def dynamic_names(self, nargs: int) -> list[str]:
        """Names of the dynamic positional arguments of a call with `nargs` positionals."""
        static_positions = {n if n >= 0 else n + nargs for n in self.static_argnums}
        names = self.names or []
        return [
            names[i] if i < len(names) else f"args[{i}]"
            for i in range(nargs)
            if i not in static_positions
        ]

    def merge(self, dynamic_args: tuple, dynamic_kwargs: dict, static: tuple) -> tuple[tuple, dict]:
        """The full call again from its dynamic and static parts."""
        positions = {int(w[5:-1]): v for w, v in static if w.startswith("args[")}
        kwargs = dict(dynamic_kwargs)
        kwargs.update((w, v) for w, v in static if not w.startswith("args["))
        args, it = [], iter(dynamic_args)
        for i in range(len(dynamic_args) + len(positions)):
            args.append(positions[i] if i in positions else next(it))
        return tuple(args), kwargs
