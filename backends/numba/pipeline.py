"""The numba pipeline generated kernels compile with: numba's own nopython pipeline, except
that while LLVM optimises the kernel's own module, its loop vectoriser interleaves
`INTERLEAVE` vector iterations.

LLVM's cost model interleaves only small loop bodies. A fused kernel's loop is long (a tanh
and a logistic are some 60 instructions per eight floats) and each iteration is one long chain
of dependent instructions, so one vector iteration at a time leaves the cores' out-of-order
windows short of independent work. Four at a time, the chain `tanh(x) * sigmoid(1.5 x) + 0.5 x`
on 2^16 floats took 72-75 us against 87-91 us, and a row softmax of 4096x1024 2.0-2.3 ms
against 2.4-3.0 ms.

The option is LLVM's (`-force-vector-interleave`), process-wide, so it is set around the
kernel's lowering pass alone: kernels are lowered under numba's compiler lock, after the
helpers they call were compiled (type inference compiles callees), so no other code is
optimised meanwhile. Hand-written helpers keep LLVM's choice: forced on the eight
accumulators of `native_loop.small_matmul_t`, it spills registers (the scanned RNN took 12 ms
against 7.3 ms). LLVM before 15 refuses an option given twice, so there the kernels compile
as numba's default pipeline would.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import register_pass
from numba.core.typed_passes import NativeLowering

INTERLEAVE = 4 if llvm.llvm_version_info >= (15,) else 0


def _interleave(count: int) -> None:
    llvm.set_option("", f"-force-vector-interleave={count}")  # 0: LLVM's own choice


@register_pass(mutates_CFG=True, analysis_only=False)
class InterleavedLowering(NativeLowering):
    """numba's lowering (which optimises and finalises the module) with interleaved loops."""

    _name = "xfuse_interleaved_lowering"

    def run_pass(self, state):
        if not INTERLEAVE:
            return super().run_pass(state)
        _interleave(INTERLEAVE)
        try:
            return super().run_pass(state)
        finally:
            _interleave(0)


class KernelCompiler(CompilerBase):
    """numba's nopython pipeline with `InterleavedLowering` in place of its lowering."""

    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.passes = [(InterleavedLowering if cls is NativeLowering else cls, text)
                     for cls, text in pm.passes]
        pm.finalize()
        return [pm]
