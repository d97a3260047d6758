"""The row thread pool (`runtime.parallel`): every row runs once, the caller takes the first
chunk, a chunk's exception reaches the caller after the other chunks finish, a split asked
for inside a chunk runs serially instead of waiting on the pool, concurrent callers get their
own rows, and a new thread count retires the old threads."""

from __future__ import annotations

import threading
import time

import pytest

from xfuse.runtime import parallel


@pytest.fixture
def threads3():
    parallel.set_num_threads(3)
    yield
    parallel.set_num_threads(None)


def test_every_row_once_and_the_caller_takes_the_first_chunk(threads3):
    seen, lock = [], threading.Lock()

    def fn(start, end):
        with lock:
            seen.append((start, end, threading.get_ident()))

    parallel.run_rows(fn, 10)
    assert sorted((s, e) for s, e, _ in seen) == [(0, 3), (3, 6), (6, 10)]
    me = threading.get_ident()
    assert [t for s, _, t in seen if s == 0] == [me]
    assert all(t != me for s, _, t in seen if s != 0), "the caller ran a chunk it handed over"


@pytest.mark.parametrize("failing", [3, 0], ids=["a pool chunk", "the caller's chunk"])
def test_an_exception_in_a_chunk_reaches_the_caller_after_the_others(threads3, failing):
    finished = []

    def fn(start, end):
        if start == failing:
            raise ZeroDivisionError(f"chunk at {start}")
        time.sleep(0.05)
        finished.append(start)

    with pytest.raises(ZeroDivisionError, match=f"chunk at {failing}"):
        parallel.run_rows(fn, 9)
    assert sorted(finished) == [s for s in (0, 3, 6) if s != failing]
    parallel.run_rows(lambda s, e: None, 9)  # the pool still works


def test_a_split_inside_a_chunk_runs_serially(threads3):
    inner = []

    def fn(start, end):
        parallel.run_rows(lambda s, e: inner.append((start, s, e, threading.get_ident())), 4)

    done = threading.Event()
    t = threading.Thread(target=lambda: (parallel.run_rows(fn, 3), done.set()), daemon=True)
    t.start()
    assert done.wait(20), "a nested split waited on the pool"
    for start, s, e, ident in inner:
        if start != 0:  # the chunks the pool ran split nothing further
            assert (s, e) == (0, 4)


def test_concurrent_callers_get_their_own_rows(threads3):
    results: dict[int, list] = {}

    def call(k):
        got = []
        parallel.run_rows(lambda s, e: got.extend(range(s, e)), 100 + k)
        results[k] = sorted(got)

    callers = [threading.Thread(target=call, args=(k,)) for k in range(6)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(20)
    assert results == {k: list(range(100 + k)) for k in range(6)}


def pool_threads() -> int:
    return sum(t.name.startswith("xfuse_") for t in threading.enumerate())


def test_a_new_thread_count_retires_the_old_threads():
    try:
        parallel.set_num_threads(4)
        parallel.run_rows(lambda s, e: None, 8)
        assert pool_threads() >= 3
        parallel.set_num_threads(2)
        parallel.run_rows(lambda s, e: None, 8)
        deadline = time.monotonic() + 10
        while pool_threads() > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool_threads() == 1
    finally:
        parallel.set_num_threads(None)


FORK = """
import os, sys
from xfuse.runtime import parallel, blas
parallel.set_num_threads(2)
rows = []
parallel.run_rows(lambda s, e: rows.append((s, e)), 8)  # the parent's pool exists now
import threading
inside, leave = threading.Event(), threading.Event()

def hold():  # another thread holds BLAS at one thread while the process forks
    with blas.single_threaded():
        inside.set()
        leave.wait()

holder = threading.Thread(target=hold)
holder.start()
inside.wait()
pid = os.fork()
if pid == 0:
    got = []
    parallel.run_rows(lambda s, e: got.extend(range(s, e)), 8)
    ok = sorted(got) == list(range(8)) and blas.threads() == [2] * len(blas.controls())
    os._exit(0 if ok else 3)
leave.set()
holder.join()
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_splits_with_threads_of_its_own_and_blas_threads_back():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", FORK], timeout=60, capture_output=True, text=True,
                         env={**__import__("os").environ, "OPENBLAS_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr


def test_a_chunk_keeps_nothing_alive_once_done(threads3):
    import functools
    import weakref

    import numpy as np

    def fill(buffer, start, end):
        buffer[start:end] = 1.0

    out = np.zeros(8)
    ref = weakref.ref(out)
    fn = functools.partial(fill, out)  # holds the buffer itself, as kernel closures do
    parallel.run_rows(fn, 8)
    assert out.sum() == 8
    del fn, out  # the caller lets go: no pool thread may still hold the buffer
    assert ref() is None, "a pool thread still holds the last chunk's arrays"


def test_a_chunk_handed_to_a_retired_pool_still_runs():
    try:
        parallel.set_num_threads(2)
        pool = parallel._get_pool(1)  # a caller holds the pool ...
        parallel.set_num_threads(3)  # ... when a new thread count retires it
        ran, callers = [], []

        def caller():
            callers.append(threading.get_ident())
            pool.submit(lambda: ran.append(threading.get_ident())).result()

        t = threading.Thread(target=caller, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), "the chunk was queued for threads that had left"
        assert ran == callers, "the chunk did not run on its caller's thread"
    finally:
        parallel.set_num_threads(None)
