"""Products split over the hand-off's threads through oneDNN (`backends.numba.split_gemm`): they
agree with float64 products on every layout oneDNN reads, split by columns or by rows with
remainders; special values follow IEEE as numpy's BLAS does; parts really run on a worker; a
failed oneDNN call raises; after splits whose worker did not take its part, products go to
numpy's BLAS for a period that doubles while trials fail, and back to the hand-off once one
passes; it declines what it does not take without writing; and the runtime
sends it exactly the products `products._splits` names, the epilogue after it then free to split
where the threads watch (softmax(relu(x @ w + b)) at 64x512 @ 512x1024 end to end). A vector
times a matrix, split by the matrix's rows in numba's loops, agrees likewise, with the same
bits whichever thread runs each part, and signed zeros as BLAS and XLA sum them (batch-1's
softmax(relu(x @ w + b)) end to end)."""

from __future__ import annotations

import time
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.numba import backend as numba_backend
from xfuse.backends.numba import gemm, handoff, split_gemm
from xfuse.backends.numba.lowering import lower
from xfuse.runtime import blas, onednn, parallel, products
from xfuse.runtime import program as prog

RNG = np.random.default_rng(11)
F32 = np.dtype(np.float32)


@pytest.fixture
def two_threads(monkeypatch):
    """Two threads, and no turning to numpy's BLAS after splits whose worker did not take its
    part (on a busy machine it may not): each split here is tried (see `test_route_...`)."""
    assert onednn.addresses() is not None, "oneDNN did not load"
    monkeypatch.setattr(split_gemm, "MISSES", split_gemm.WINDOW + 1)
    monkeypatch.setattr(split_gemm, "_route", split_gemm._Route())
    parallel.set_num_threads(2)
    yield
    parallel.set_num_threads(None)


def _operand(rows: int, cols: int, layout: str) -> np.ndarray:
    """A (rows, cols) float32 matrix: rows contiguous (N), the transpose of a (cols, rows) one
    (T), or every other row of a taller one (rows a stride apart, still read as N)."""
    if layout == "N":
        return RNG.standard_normal((rows, cols)).astype(np.float32)
    if layout == "T":
        return RNG.standard_normal((cols, rows)).astype(np.float32).T
    return RNG.standard_normal((2 * rows, cols)).astype(np.float32)[::2]


def _assert_product(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Within k roundings of float32 (relative to the sum of |terms|) of the float64 product."""
    want = a.astype(np.float64) @ b.astype(np.float64)
    size = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    bound = (a.shape[1] + 1) * 2.0**-24 * size + 2.0**-126
    error = np.abs(got.astype(np.float64) - want)
    assert got.dtype == F32 and got.shape == want.shape
    assert (error <= bound).all(), f"max error {error.max()} at {np.unravel_index(error.argmax(), error.shape)}"


@pytest.mark.parametrize("la", ["N", "T", "S"])
@pytest.mark.parametrize("lb", ["N", "T", "S"])
def test_products_agree_with_float64_on_every_layout_split_both_ways(two_threads, la, lb):
    # columns (N >= M) in units of 16 with a remainder, rows (M > N) in units of 8 with one
    for m, k, n in [(64, 512, 1024), (37, 33, 1000), (2, 300, 700), (300, 70, 40), (1001, 17, 3), (9, 5, 2)]:
        a, b = _operand(m, k, la), _operand(k, n, lb)
        out = np.full((m, n), np.nan, np.float32)
        assert split_gemm.split_f32(a, b, out), (m, k, n)
        _assert_product(out, a, b)


def test_the_parts_write_only_their_own_part_of_a_wider_result(two_threads):
    a, b = _operand(64, 128, "N"), _operand(128, 200, "N")
    wide = np.full((64, 300), -7.0, np.float32)
    assert split_gemm.split_f32(a, b, wide[:, 50:250])
    _assert_product(wide[:, 50:250], a, b)
    assert (wide[:, :50] == -7.0).all() and (wide[:, 250:] == -7.0).all()


def test_special_values_as_numpys_blas(two_threads):
    a, b = _operand(96, 64, "N"), _operand(64, 160, "N")
    a[3, 5], a[10, :] = np.nan, 0.0
    b[7, 20], b[8, 20], b[9, 100], b[:, 150] = np.inf, np.inf, -np.inf, -0.0
    a[21, 7], a[21, 8] = 1.0, -1.0  # inf - inf
    a[20, 11:13], b[11:13, 30] = 3e38, 1.0  # 6e38 overflows
    a[40, :] = -0.0
    with np.errstate(invalid="ignore", over="ignore"):
        want = a @ b  # numpy's BLAS: IEEE in each product and sum
    out = np.zeros((96, 160), np.float32)
    assert split_gemm.split_f32(a, b, out)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    assert np.isnan(out[21, 20]) and np.isnan(out[3]).all() and out[20, 30] == np.inf
    infinite = np.isinf(want)
    assert infinite.sum() > 100  # most of columns 20 and 100
    np.testing.assert_array_equal(out[infinite], want[infinite])
    assert out[10, 150] == 0.0 and np.signbit(out[10, 150]) == np.signbit(want[10, 150])  # 0 * -0.0 summed
    assert out[40, 0] == 0.0 and np.signbit(out[40, 0]) == np.signbit(want[40, 0])
    finite = np.isfinite(want)
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-4, atol=1e-3)


def test_a_worker_runs_parts(two_threads):
    # A part a worker has not begun when the caller's is done goes back to the caller; on a busy
    # machine the worker may not be scheduled for a while, so parts large enough to take
    # milliseconds are tried until one ran on a worker or a minute has passed.
    a, b = _operand(256, 1024, "N"), _operand(1024, 2048, "N")
    out = np.empty((256, 2048), np.float32)
    before = handoff.served()
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        assert split_gemm.split_f32(a, b, out)
        if handoff.served() > before:
            break
    assert handoff.served() > before, "no part ran on a worker"
    _assert_product(out, a, b)


class _Clock:
    """time.perf_counter as the test sets it."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def routed(monkeypatch, two_threads):
    """split_f32 with the route's rule as it is, a clock the test moves, workers that never
    take a part (`handoff.served` stays), and a list of where each product went."""
    monkeypatch.setattr(split_gemm, "MISSES", 3)
    monkeypatch.setattr(split_gemm, "MISS_GAP_S", 2.0**-9)  # times below exact in binary
    clock = _Clock()
    monkeypatch.setattr(split_gemm, "time", clock)
    monkeypatch.setattr(handoff, "served", lambda: 7)
    through = []
    real_split, real_blas = split_gemm._split, split_gemm._in_blas
    monkeypatch.setattr(split_gemm, "_split", lambda fn: through.append("hand-off") or real_split(fn))
    monkeypatch.setattr(split_gemm, "_in_blas", lambda a, b, out: through.append("blas") or real_blas(a, b, out))
    a, b = _operand(64, 512, "N"), _operand(512, 1024, "N")

    def product(advance: float) -> str:
        clock.now += advance
        out = np.zeros((64, 1024), np.float32)
        assert split_gemm.split_f32(a, b, out)
        _assert_product(out, a, b)
        return through[-1]

    return product, clock


def test_route_turns_to_numpys_blas_after_misses_then_tries_the_hand_off_again(routed):
    product, clock = routed
    gap = split_gemm.MISS_GAP_S
    assert [product(gap) for _ in range(3)] == ["hand-off"] * 3  # three misses: the third turns
    route = split_gemm._route
    assert route.blas_until == pytest.approx(clock.now + split_gemm.PERIOD_S) and route.trial
    assert product(2.0**-6) == "blas" and route.judged_from == clock.now + split_gemm.SPIN_S
    assert product(split_gemm.PERIOD_S - 2.0**-5) == "blas"  # the last of the period
    assert product(2.0**-5) == "hand-off"  # the period is over
    assert route.outcomes == [] and clock.now < route.judged_from  # BLAS's threads may spin yet: not judged
    clock.now = route.judged_from
    assert [product(gap) for _ in range(3)] == ["hand-off"] * 3  # judged: the trial fails
    assert route.period == 2 * split_gemm.PERIOD_S and product(0.0) == "blas"


def test_route_counts_misses_close_together_once(routed):
    product, clock = routed
    for _ in range(6):
        assert product(split_gemm.MISS_GAP_S / 4) == "hand-off"
    assert split_gemm._route.outcomes == [False, False]  # 1.5 gaps: two misses counted
    assert product(split_gemm.MISS_GAP_S) == "hand-off" and product(0.0) == "blas"


def test_route_period_doubles_to_its_limit_and_a_passing_trial_resets_it():
    route, now = split_gemm._Route(), 0.0
    route.trial = True
    periods = []
    for _ in range(8):
        for _ in range(split_gemm.MISSES):
            now += split_gemm.MISS_GAP_S
            route.judge(False, now)
        periods.append(route.period)
        assert route.blas_until == pytest.approx(now + route.period) and route.outcomes == []
    assert periods[:3] == [2 * split_gemm.PERIOD_S, 4 * split_gemm.PERIOD_S, 8 * split_gemm.PERIOD_S]
    assert max(periods) == periods[-1] == split_gemm.PERIOD_MAX_S
    for i in range(split_gemm.WINDOW):  # a worker runs every part: the trial passes at WINDOW
        assert route.trial
        route.judge(True, now + i)
    assert not route.trial and route.period == split_gemm.PERIOD_S
    route.judge(False, now + 100)  # misses among passes: a window of WINDOW, MISSES of them turn
    for i in range(split_gemm.WINDOW - split_gemm.MISSES):
        route.judge(True, now + 101 + i)
    route.judge(False, now + 200)
    assert route.blas_until < now + 200  # two misses in the window: not yet
    route.judge(False, now + 201)
    assert route.blas_until == pytest.approx(now + 201 + split_gemm.PERIOD_S) and route.period == split_gemm.PERIOD_S


def test_a_failed_onednn_call_raises():
    calls = onednn.addresses()
    a, b, c = (np.ones((4, 4), np.float32) for _ in range(3))
    n = ord("N")  # a leading dimension shorter than a row: oneDNN refuses
    with pytest.raises(RuntimeError, match="dnnl_sgemm failed"):
        split_gemm.sgemm_part(0, 1, *calls, 1, 4, 4, 4, n, a.ctypes.data, 2, n, b.ctypes.data, 4, c.ctypes.data, 4)


def test_it_declines_what_it_does_not_take_without_writing(two_threads):
    a, b = _operand(64, 32, "N"), _operand(32, 48, "N")
    wide = RNG.standard_normal((64, 96)).astype(np.float32)
    cases = {
        "float64": (a.astype(np.float64), b, np.zeros((64, 48), np.float32)),
        "one row": (a[:1], b, np.zeros((1, 48), np.float32)),
        "one column": (a, b[:, :1], np.zeros((64, 1), np.float32)),
        "3-D": (a[None], b[None], np.zeros((1, 64, 48), np.float32)),
        "strided both ways": (wide[:, ::2][:, :32], b, np.zeros((64, 48), np.float32)),
        "shapes": (a, b[:31], np.zeros((64, 48), np.float32)),
        "result shape": (a, b, np.zeros((64, 47), np.float32)),
        "result transposed": (a, b, np.zeros((48, 64), np.float32).T),
        "read-only result": (a, b, np.zeros((64, 48), np.float32)),
    }
    cases["read-only result"][2].flags.writeable = False
    for name, (x, y, out) in cases.items():
        before = out.copy()
        assert not split_gemm.split_f32(x, y, out), name
        np.testing.assert_array_equal(out, before, err_msg=name)
    overlap = np.zeros((64, 64), np.float32)  # the result over its own left side
    assert not split_gemm.split_f32(overlap[:, :32], _operand(32, 32, "N"), overlap[:, 32:])


def test_one_thread_declines():
    parallel.set_num_threads(1)
    try:
        out = np.zeros((64, 1024), np.float32)
        assert not split_gemm.split_f32(_operand(64, 512, "N"), _operand(512, 1024, "N"), out)
        assert not out.any()
    finally:
        parallel.set_num_threads(None)


def test_inside_a_split_it_declines(two_threads):
    """In a part of a split (a share of attention's blocks, a part of a split loop) the other
    threads are busy with the other parts: the product stays on this thread."""
    answers = []

    def part():
        out = np.zeros((64, 1024), np.float32)
        answers.append(split_gemm.split_f32(_operand(64, 512, "N"), _operand(512, 1024, "N"), out))
        answers.append(out.any())

    parallel.run_each([part, part])
    assert answers == [False, False, False, False]


@pytest.fixture
def vectors(monkeypatch, two_threads):
    """Vectors times matrices split here whatever the CPU's vector width (the rule is measured
    on AVX-512 only; the parts are numba loops that run anywhere)."""
    monkeypatch.setattr(split_gemm, "vectors_enabled", lambda: True)


def _vector_by(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    return RNG.standard_normal((1, k)).astype(np.float32), RNG.standard_normal((k, n)).astype(np.float32)


def test_a_vector_times_a_matrix_agrees_with_float64_split_by_the_matrix_rows(vectors):
    # rows in eights and not, fewer rows than threads, columns odd and few
    for k, n in [(2048, 1000), (1027, 513), (9, 2), (1, 300), (3, 17), (200, 4096)]:
        a, b = _vector_by(k, n)
        out = np.full((1, n), np.nan, np.float32)
        assert split_gemm.vector_f32(a, b, out), (k, n)
        _assert_product(out, a, b)


def test_a_vector_product_is_the_same_whichever_thread_runs_each_block_in_either_order(vectors):
    a, b = _vector_by(4099, 1000)  # 16 MiB: time for a worker asleep to wake and take its part
    block = split_gemm.VECTOR_BLOCK_BYTES // 4000 // 8 * 8
    alone = {}
    for backward in (0, 1):  # every block on this thread, each way round
        sums = np.empty((-(-4099 // block), 1000), np.float32)
        split_gemm.sgemv_part(0, 2, a[0], b, sums, block, 2, backward)
        alone[backward] = np.empty(1000, np.float32)
        split_gemm._summed(alone[backward], sums)
    np.testing.assert_array_equal(alone[0], alone[1])
    _assert_product(alone[0][None], a, b)
    before, ways = handoff.served(), set()
    for _ in range(500):  # a part a worker has not begun when the caller's is done goes back to the caller
        out = np.empty((1, 1000), np.float32)
        assert split_gemm.vector_f32(a, b, out)
        ways.add(split_gemm._backward)
        np.testing.assert_array_equal(out[0], alone[0])
        if handoff.served() > before and len(ways) == 2:
            break
    assert handoff.served() > before, "no part ran on a worker"
    assert ways == {0, 1}  # calls take turns running their blocks backwards


def test_a_vector_products_sums_of_many_blocks_come_from_the_runtimes_pool(monkeypatch, vectors):
    monkeypatch.setattr(split_gemm, "_POOL_FLOATS", 4 * 512)
    handed = []
    real = split_gemm.POOL.empty
    monkeypatch.setattr(split_gemm.POOL, "empty", lambda shape, dtype: handed.append(shape) or real(shape, dtype))
    a, b = _vector_by(1000, 512)  # blocks of 256 rows: 4 of them
    out = np.empty((1, 512), np.float32)
    assert split_gemm.vector_f32(a, b, out)
    assert handed == [(4, 512)]
    _assert_product(out, a, b)


def test_a_vector_products_special_values_as_numpys_blas(vectors):
    a, b = _vector_by(300, 160)
    a[0, 5] = np.nan  # every column NaN
    b[7, 20], b[8, 20], b[9, 100] = np.inf, np.inf, -np.inf
    b[[10, 250], 30] = np.inf  # inf from each part
    a[0, 10], a[0, 250] = 1.0, -1.0  # ... of opposite signs: inf - inf across the parts
    b[[11, 12], 40], a[0, [11, 12]] = 3e38, 1.0  # 6e38 overflows
    with np.errstate(invalid="ignore", over="ignore"):
        want = a @ b
    out = np.zeros((1, 160), np.float32)
    assert split_gemm.vector_f32(a, b, out)
    assert np.isnan(out).all() and np.isnan(want).all()
    a[0, 5] = 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        want = a @ b
    assert split_gemm.vector_f32(a, b, out)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    assert np.isnan(out[0, 30]) and out[0, 40] == np.inf and np.isnan(out[0, 20]) == np.isnan(want[0, 20])
    infinite = np.isinf(want)
    np.testing.assert_array_equal(out[infinite], want[infinite])
    finite = np.isfinite(want)
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-4, atol=1e-3)
    zeros, c = np.full((1, 300), -0.0, np.float32), _vector_by(300, 160)[1]
    for x, y in [(zeros, c), (zeros, np.abs(c)), (np.zeros_like(zeros), -np.abs(c))]:  # every product 0.0 or -0.0
        got = np.full((1, 160), 5.0, np.float32)
        assert split_gemm.vector_f32(x, y, got)
        assert (got == 0.0).all()
        np.testing.assert_array_equal(np.signbit(got), np.signbit(x @ y))  # as BLAS's sums
        np.testing.assert_array_equal(np.signbit(got), np.signbit(jax.jit(jnp.matmul)(x, y)))  # and XLA's


def test_a_vector_product_goes_to_numpys_blas_while_the_route_says_so(monkeypatch, vectors):
    went = []
    real = split_gemm._in_blas
    monkeypatch.setattr(split_gemm, "_in_blas", lambda a, b, out: went.append(a.shape) or real(a, b, out))
    split_gemm._route.blas_until = float("inf")
    a, b = _vector_by(512, 1024)
    out = np.empty((1, 1024), np.float32)
    assert split_gemm.vector_f32(a, b, out)
    assert went == [(1, 512)]
    _assert_product(out, a, b)


def test_a_vector_product_declines_what_its_parts_do_not_read_without_writing(vectors):
    a, b = _vector_by(64, 96)
    cases = {
        "a strided matrix": (a, np.repeat(b, 2, axis=1)[:, ::2]),
        "a transposed matrix": (a, np.ascontiguousarray(b.T).T),
        "float64": (a.astype(np.float64), b),
        "a result of another row's stride": (a, b, np.zeros((1, 192), np.float32)[:, ::2]),
    }
    for name, (x, y, *given) in cases.items():
        out = given[0] if given else np.full((1, 96), 3.0, np.float32)
        out[...] = 3.0
        assert not split_gemm.vector_f32(x, y, out), name
        assert (out == 3.0).all(), name
    row = np.ones((1, 96 + 32), np.float32)  # the result over half its own vector
    assert not split_gemm.vector_f32(row[:, :64], b, row[:, 32:])
    assert (row == 1.0).all()
    parallel.set_num_threads(1)
    try:
        out = np.full((1, 96), 3.0, np.float32)
        assert not split_gemm.vector_f32(a, b, out) and (out == 3.0).all()
    finally:
        parallel.set_num_threads(2)


def test_the_runtime_sends_it_exactly_the_products_its_rule_names(monkeypatch, two_threads):
    taken = []

    def spy(a, b, out):
        taken.append((a.shape, b.shape))
        return split_gemm.split_f32(a, b, out)

    both = products.BackendProducts(thread=lambda a, b, out: False, split=spy)
    cases = [  # (a shape, b shape, backend, taken?)
        ((64, 512), (512, 1024), both, True),  # softmax_relu's 2**25 multiply-adds
        ((1, 64, 512), (1, 512, 1024), both, True),  # a batch of one
        ((64, 256), (256, 128), both, False),  # 2**21: below SPLIT_PRODUCT_MIN, one thread
        ((512, 512), (512, 256), both, True),  # 2**26, ONEDNN_MIN: large ones too
        ((4, 64, 256), (4, 256, 256), both, False),  # a batch
        ((1, 4096), (4096, 1024), both, False),  # a vector: the backend's product of a vector, or BLAS's GEMV
        ((256, 256), (256, 64), both, False),  # one the product for one thread takes
        ((256, 256), (256, 64), products.BackendProducts(split=spy), True),  # ... where there is none
    ]
    for ashape, bshape, backend, expected in cases:
        a = RNG.standard_normal(ashape).astype(np.float32)
        b = RNG.standard_normal(bshape).astype(np.float32)
        out = np.empty((*ashape[:-1], bshape[-1]), np.float32)
        taken.clear()
        products.matmul(a, b, out, F32, own=False, backend=backend)
        assert bool(taken) is expected, (ashape, bshape, taken)
        a3, b3 = a.reshape(-1, *ashape[-2:]), b.reshape(-1, *bshape[-2:])
        for o, x, y in zip(out.reshape(len(a3), ashape[-2], -1), a3, b3):
            _assert_product(o, x, y)
    a64 = RNG.standard_normal((64, 512))
    taken.clear()
    products.matmul(a64, RNG.standard_normal((512, 1024)), np.empty((64, 1024)), np.dtype(np.float64), backend=both)
    assert taken == []  # float64 stays with BLAS
    monkeypatch.setattr(blas, "ENABLED", False)  # XFUSE_SPLIT_PRODUCTS=0
    products.matmul(*[RNG.standard_normal(s).astype(np.float32) for s in ((64, 512), (512, 1024))],
                    np.empty((64, 1024), np.float32), F32, backend=both)
    assert taken == []


def test_the_runtime_hands_it_exactly_the_vector_products_its_rule_names(monkeypatch, vectors):
    taken, answer = [], [True]

    def spy(a, b, out):
        taken.append((a.shape, b.shape))
        return answer[0] and split_gemm.vector_f32(a, b, out)

    backend = products.BackendProducts(vector=spy)
    cases = [  # (lhs dims, rhs dims, contracting, batch, dtype, taken?)
        ([1, 4096], [4096, 1024], ([1], [0]), ([], []), "float32", True),  # 16 MiB
        ([1, 1, 1024], [1, 1024, 512], ([2], [1]), ([0], [0]), "float32", True),  # 2 MiB, VECTOR_SPLIT_MIN, batch 1
        ([1, 1024], [1024, 511], ([1], [0]), ([], []), "float32", False),  # a little less: BLAS's GEMV
        ([1, 8192], [8192, 127], ([1], [0]), ([], []), "float32", False),  # too few columns
        ([1, 127], [127, 8192], ([1], [0]), ([], []), "float32", False),  # too few rows
        ([3, 1, 1024], [3, 1024, 1024], ([2], [1]), ([0], [0]), "float32", False),  # a batch of vectors
        ([1, 2048], [1024, 2048], ([1], [1]), ([], []), "float32", False),  # the matrix transposed
        ([1, 2048], [2048, 1024], ([1], [0]), ([], []), "float64", False),
    ]
    for lhs, rhs, contracting, batch, dtype, expected in cases:
        a = RNG.standard_normal(lhs).astype(dtype)
        b = RNG.standard_normal(rhs).astype(dtype)
        for said in (True, False):  # where it declines, the product runs elsewhere
            answer[0] = said
            dims = [*lhs[:-1], rhs[-1] if contracting[1] == [len(rhs) - 2] else rhs[-2]]
            out = np.full(dims, np.nan, dtype)
            taken.clear()
            products.make_dot(lhs, rhs, contracting, batch, dtype, False, backend)(a, b, out)
            assert bool(taken) is expected, (lhs, rhs, dtype)
            b64 = b.astype(np.float64)
            want = a.astype(np.float64) @ (b64 if contracting[1] == [len(rhs) - 2] else b64.T)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3 * np.sqrt(lhs[-1]))
    assert products.apart([1, 4096], [4096, 1024], F32, backend)  # its program's products are off BLAS's threads
    monkeypatch.setattr(blas, "ENABLED", False)  # XFUSE_SPLIT_PRODUCTS=0
    taken.clear()
    products.make_dot([1, 4096], [4096, 1024], ([1], [0]), ([], []), "float32", False, backend)(
        RNG.standard_normal((1, 4096)).astype(np.float32), RNG.standard_normal((4096, 1024)).astype(np.float32),
        np.empty((1, 1024), np.float32))
    assert taken == []


def softmax_relu(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def test_softmax_relu_through_xfuse_jit_splits_its_product_and_may_split_its_epilogue(monkeypatch, two_threads):
    monkeypatch.setattr(numba_backend, "split_enabled", lambda: True)  # as on an AVX-512 CPU with oneDNN
    calls = []

    def counted(a, b, out):
        calls.append((a.shape, b.shape))
        return split_gemm.split_f32(a, b, out)

    monkeypatch.setattr(numba_backend, "split_f32", counted)
    splits = []  # the hand-off's splits: the product's parts (all its rows), the epilogue's (watching)
    real = handoff.Splitter.__call__
    monkeypatch.setattr(handoff.Splitter, "__call__",
                        lambda s, args, rows, first=0, watching=False: splits.append((s.fn, watching))
                        or real(s, args, rows, first, watching))
    x, w, b = (RNG.standard_normal(s).astype(np.float32) for s in ((64, 512), (512, 1024), (1024,)))
    w *= np.float32(0.05)
    compiled = xfuse.jit(softmax_relu).lower(x, w, b).compile()
    got = compiled(x, w, b)
    assert calls == [((64, 512), (512, 1024))]
    assert splits[0] == (split_gemm.sgemm_part, False)
    assert len(splits) == 2 and splits[1][1], "the epilogue did not try the watching workers"
    np.testing.assert_allclose(got, jax.jit(softmax_relu)(x, w, b), rtol=1e-5, atol=1e-7)
    # its one step runs no product on BLAS's own threads, so a watching epilogue may split;
    # without the backend's split it would
    (step,) = [s for s in lower(compiled.module).program["steps"] if s["op"] == "kernel"]
    assert step["dot"] is not None and step["watching"]
    assert not prog._on_blas_threads(step, products.BackendProducts(split=counted))
    assert prog._on_blas_threads(step, products.BackendProducts())
    assert prog._on_blas_threads(step, None)


def test_batch_one_softmax_relu_through_xfuse_jit_splits_its_vector_product(monkeypatch, vectors):
    monkeypatch.setattr(numba_backend, "vectors_enabled", lambda: True)  # as where kernels use 512-bit vectors
    calls = []

    def counted(a, b, out):
        calls.append((a.shape, b.shape))
        return split_gemm.vector_f32(a, b, out)

    monkeypatch.setattr(numba_backend, "vector_f32", counted)
    splits = []
    real = handoff.Splitter.__call__
    monkeypatch.setattr(handoff.Splitter, "__call__",
                        lambda s, args, rows, first=0, watching=False: splits.append(s.fn)
                        or real(s, args, rows, first, watching))
    x, w, b = (RNG.standard_normal(s).astype(np.float32) for s in ((1, 2048), (2048, 1000), (1000,)))
    w *= np.float32(0.05)
    compiled = xfuse.jit(softmax_relu).lower(x, w, b).compile()
    for x_ in (x, np.where(np.arange(2048) == 7, np.inf, x).astype(np.float32)):  # inf: NaN and inf columns
        calls.clear()
        got, want = compiled(x_, w, b), jax.jit(softmax_relu)(x_, w, b)
        assert calls == [((1, 2048), (2048, 1000))] and split_gemm.sgemv_part in splits
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert np.isnan(got).all()  # an infinite column makes the row's max infinite


def test_the_backend_hands_it_over_only_where_it_is_enabled_and_a_program_has_a_product(monkeypatch):
    seen = []
    real_build = numba_backend.build

    def build(*args, **kwargs):
        seen.append(kwargs["backend"])
        return real_build(*args, **kwargs)

    monkeypatch.setattr(numba_backend, "build", build)
    x, w, b = (RNG.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 32), (32,)))
    xfuse.jit(softmax_relu)(x, w, b)
    xfuse.jit(lambda v: jnp.tanh(v) + 1.0)(x)
    with_product, without = seen
    assert (with_product.split is not None) is split_gemm.enabled()
    assert (with_product.vector is not None) is split_gemm.vectors_enabled()
    assert without.split is None and without.vector is None
    assert split_gemm.enabled() is (handoff.ENABLED and onednn.preferred() and onednn.installed())
    assert split_gemm.vectors_enabled() is (handoff.ENABLED and gemm.ENABLED)
