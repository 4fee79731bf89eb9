"""The event loop's compiler pipeline: numba's own, with a pause before type inference.

numba compiles `kernel.run` in two halves. The first (reading the bytecode, inlining the
port code, SSA) needs nothing else compiled; the second types every call, and typing a
call to another kernel compiles that kernel or loads it from the cache. A full compile
(`aifabric.warmup`) therefore starts the loop at once, beside the processes compiling its
callees, and puts a step in `BEFORE_TYPING` that joins them and waits until every callee
is in the cache: the first half overlaps their compile instead of following it. Nothing is
queued in any other compile, and the machine code is numba's default pipeline's.
"""

from __future__ import annotations

from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import NopythonTypeInference

BEFORE_TYPING: list = []  # callables, each run once when the next loop compile reaches typing


@register_pass(mutates_CFG=False, analysis_only=True)
class BeforeTyping(FunctionPass):
    _name = "aifabric_before_typing"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        while BEFORE_TYPING:
            BEFORE_TYPING.pop(0)()
        return False


class LoopCompiler(CompilerBase):
    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        at = [p for p, _ in pm.passes].index(NopythonTypeInference)
        pm.passes.insert(at, (BeforeTyping, "wait for the loop's callees"))
        pm.finalize()
        return [pm]
