"""How a kernel's loop accumulates a reduction in order: the initial value, the update of each
step and the result (`combiner`), and the identity of a max or min (`extreme`).
"""

from __future__ import annotations

import numpy as np

from xfuse.hlo import Computation, Instruction, Op

from .emitter import Ix, compute_dtype, literal, np_name


def extreme(dtype, smallest: bool) -> str:
    """The smallest (or largest) value of a dtype: a max (min) reduction's identity."""
    if dtype.is_pred:
        return "False" if smallest else "True"
    if dtype.is_float:
        return literal(float("-inf") if smallest else float("inf"), dtype)
    info = np.iinfo(dtype.numpy)
    return literal(info.min if smallest else info.max, dtype)


def combiner(comp: Computation, r: Instruction, acc: str, v: Ix, rnames: list[str]):
    """(init lines, update lines, result) of reduction `r` accumulating `v` into `acc` in
    order, over the loop variables `rnames` (argmax and argmin record the first's index)."""
    dtype = compute_dtype(comp[r.operands[0]].shape.dtype)
    T = np_name(dtype)
    op = r.op
    if op in (Op.ARGMAX, Op.ARGMIN):
        idx = f"{acc}_i"
        better = ">" if op is Op.ARGMAX else "<"
        start = extreme(dtype, smallest=op is Op.ARGMAX)
        take = f"({v.text} {better} {acc})"
        if dtype.is_float:
            take = f"({take} | (({v.text} != {v.text}) & ({acc} == {acc})))"
        position = rnames[0]
        init = [f"{acc} = {start}", f"{idx} = 0"]
        update = [
            f"take = {take}",
            f"{acc} = {v.text} if take else {acc}",
            f"{idx} = {position} if take else {idx}",
        ]
        out = np_name(r.shape.dtype)
        return init, update, Ix(f"{out}({idx})")
    if op is Op.REDUCE_SUM:
        return [f"{acc} = {literal(0, dtype)}"], [f"{acc} = {T}({acc} + {v.text})"], Ix(acc)
    if op is Op.REDUCE_PROD:
        return [f"{acc} = {literal(1, dtype)}"], [f"{acc} = {T}({acc} * {v.text})"], Ix(acc)
    if op in (Op.REDUCE_MAX, Op.REDUCE_MIN):
        largest = op is Op.REDUCE_MAX
        if dtype.is_pred:
            word = "|" if largest else "&"
            return [f"{acc} = {not largest}"], [f"{acc} = {acc} {word} {v.text}"], Ix(acc)
        start = extreme(dtype, smallest=largest)
        fn = ("scalar.f" if dtype.is_float else "scalar.i") + ("max" if largest else "min")
        return [f"{acc} = {start}"], [f"{acc} = {T}({fn}({acc}, {v.text}))"], Ix(acc)
    if op in (Op.REDUCE_AND, Op.REDUCE_OR):
        conj = op is Op.REDUCE_AND
        word = "&" if conj else "|"
        if dtype.is_pred:
            return [f"{acc} = {conj}"], [f"{acc} = {acc} {word} {v.text}"], Ix(acc)
        start = f"{T}(~{T}(0))" if conj else literal(0, dtype)
        return [f"{acc} = {start}"], [f"{acc} = {T}({acc} {word} {v.text})"], Ix(acc)
    raise NotImplementedError(f"the numba backend cannot reduce with {op}")


__all__ = ["combiner", "extreme"]
