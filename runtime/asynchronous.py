"""Asynchronous execution: `call_async(executable, arrays)` returns a Future at once; the steps
run on a small pool of threads, each as soon as the steps it reads from are done, so
independent kernels run at the same time. An error in a step reaches the future as the
`KernelError` naming the step (its kernel and fusion).

Steps running at once cannot share an arena planned for running one after another, so here
every buffer is its own allocation (from the pool for large ones). The pool here is not the
one kernels split their rows over (runtime.parallel): a step waiting for its row chunks never
blocks the threads those chunks need. Standard library and numpy only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .executable import Executable, KernelError
from .pool import POOL

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            workers = max(2, min(4, os.cpu_count() or 2))
            _executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xfuse-async")
        return _executor


class _Run:
    """One asynchronous call: the values so far, and how many inputs each step still waits for."""

    def __init__(self, executable: Executable, arrays: Sequence[np.ndarray], future: Future):
        self.ex = executable
        self.future = future
        self.values: list = [None] * executable.n_values
        for slot, array in zip(executable.params, arrays):
            self.values[slot] = array
        for slot, array in executable.constants.items():
            self.values[slot] = array
        producer = {}
        for i, step in enumerate(executable.steps):
            for slot in step.outputs:
                producer[slot] = i
        self.waiting = []
        self.dependents: list[list[int]] = [[] for _ in executable.steps]
        for i, step in enumerate(executable.steps):
            needs = {producer[v] for v in step.inputs if v in producer}
            self.waiting.append(len(needs))
            for j in needs:
                self.dependents[j].append(i)
        self.remaining = len(executable.steps)
        self.lock = threading.Lock()
        self.failed = False

    def start(self) -> None:
        ready = [i for i, n in enumerate(self.waiting) if n == 0]
        if not ready:
            self._complete()
        for i in ready:
            executor().submit(self._step, i)

    def _step(self, i: int | None) -> None:
        """Runs step i, then, on this thread, one of the steps it made ready (the others go
        to the pool), until none is left."""
        while i is not None and not self.failed:
            i = self._run_one(i)

    def _run_one(self, i: int) -> int | None:
        step = self.ex.steps[i]
        try:
            inputs = [self.values[v] for v in step.inputs]
            if step.kind == "alias":
                outputs = step.run(inputs)
            else:
                outputs = [POOL.empty(tuple(s.shape), s.dtype) for s in step.out_specs]
                step.run(inputs, outputs)
            if len(step.outputs) == 1 and len(step.out_specs) > 1:
                outputs = [tuple(outputs)]
            for slot, out in zip(step.outputs, outputs):
                self.values[slot] = out
        except BaseException as e:  # noqa: BLE001 - handed to the future
            with self.lock:
                if self.failed:
                    return None
                self.failed = True
            self.future.set_exception(e if isinstance(e, KernelError) else step.failed(e))
            return None
        ready = []
        with self.lock:
            self.remaining -= 1
            done = self.remaining == 0
            for j in self.dependents[i]:
                self.waiting[j] -= 1
                if self.waiting[j] == 0:
                    ready.append(j)
        if done:
            self._complete()
            return None
        for j in ready[1:]:
            executor().submit(self._step, j)
        return ready[0] if ready else None

    def _complete(self) -> None:
        try:
            self.future.set_result(self.ex.finish(self.values))
        except BaseException as e:  # noqa: BLE001
            self.future.set_exception(e)


def call_async(executable: Executable, arrays: Sequence[np.ndarray]) -> Future:
    future: Future = Future()
    future.set_running_or_notify_cancel()
    _Run(executable, list(arrays), future).start()
    return future
