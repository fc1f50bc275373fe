"""Tests of the built-in Cholesky tile kernels (taskgraph.kernels).

Every kernel is checked against a slow, obviously correct NumPy version, for both
dtypes, on whole Fortran arrays and on strided column-major views of a larger array
(whose memory outside the view must stay untouched), and through the ``py_func`` of
the jitted inner functions.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from taskgraph.kernels import CHOLESKY_KERNELS, cholesky, compile_all, gemm, potrf, syrk, trsm

from taskgraph.core.errors import NotPositiveDefiniteError
from taskgraph.dsl.access import Mode

pytestmark = pytest.mark.timeout(120)

DTYPES = ["float64", "float32"]
LAYOUTS = ["fortran", "view"]
RTOL = {"float64": 1e-12, "float32": 2e-5}


# -- helpers --------------------------------------------------------------------------


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


def spd(rng: np.random.Generator, n: int) -> np.ndarray:
    """A well-conditioned symmetric positive definite matrix (float64)."""
    x = rng.standard_normal((n, n))
    return x @ x.T / max(n, 1) + np.eye(n)


def lower_factor(rng: np.random.Generator, k: int) -> np.ndarray:
    """A well-conditioned lower-triangular k×k factor, with junk in its upper triangle."""
    return rng.standard_normal((k, k)) / max(k, 1) + 2 * np.eye(k)


class Tile:
    """A tile as a kernel sees it: a Fortran array, or a strided view into a bigger one."""

    def __init__(self, x: np.ndarray, dtype: str, layout: str, rng: np.random.Generator):
        x = np.asarray(x, dtype=dtype)
        if layout == "fortran":
            self.big, self.array = None, np.asfortranarray(x.copy())
        else:
            rows, cols = x.shape
            self.big = np.asfortranarray(rng.standard_normal((rows + 5, cols + 4)).astype(dtype))
            self.array = self.big[2 : 2 + rows, 1 : 1 + cols]
            self.array[...] = x
            assert self.array.strides[1] == self.big.strides[1]
        self.before = (self.big if self.big is not None else self.array).copy(order="F")

    def check_outside_untouched(self) -> None:
        if self.big is None:
            return
        rows, cols = self.array.shape
        after = self.big.copy(order="F")
        after[2 : 2 + rows, 1 : 1 + cols] = self.before[2 : 2 + rows, 1 : 1 + cols]
        np.testing.assert_array_equal(after, self.before, err_msg="memory outside the view")

    def before_tile(self) -> np.ndarray:
        """The tile's contents before the kernel ran, in its own dtype."""
        if self.big is None:
            return self.before
        rows, cols = self.array.shape
        return self.before[2 : 2 + rows, 1 : 1 + cols]

    def original(self) -> np.ndarray:
        """The tile's contents before the kernel ran, in float64 for the references."""
        return self.before_tile().astype(np.float64)


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, scale: float = 1.0) -> None:
    tol = RTOL[dtype] * max(scale, 1.0) * max(want.shape + (1,))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=tol)


# -- the slow references --------------------------------------------------------------


def ref_potrf(a: np.ndarray) -> np.ndarray:
    return np.tril(np.linalg.cholesky(a)) + np.triu(a, 1)


def ref_trsm(l: np.ndarray, b: np.ndarray) -> np.ndarray:  # noqa: E741
    return np.linalg.solve(np.tril(l), b.T).T  # X Lᵀ = B  <=>  L Xᵀ = Bᵀ


def ref_syrk(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.tril(c - a @ a.T) + np.triu(c, 1)


def ref_gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return c - a @ b.T


# -- runners: one per kernel, shared by the wrapper and py_func tests ------------------


def run_potrf(fn, rng, n: int, dtype: str, layout: str) -> None:
    a = Tile(spd(rng, n), dtype, layout, rng)
    result = fn(a.array)
    if result is not None:  # the inner function returns LAPACK's info
        assert result == 0
    assert_close(a.array, ref_potrf(a.original()), dtype, scale=n)
    np.testing.assert_array_equal(np.triu(a.array, 1), np.triu(a.before_tile(), 1))
    a.check_outside_untouched()


def run_trsm(fn, rng, m: int, k: int, dtype: str, layout: str) -> None:
    l = Tile(lower_factor(rng, k), dtype, layout, rng)  # noqa: E741
    b = Tile(rng.standard_normal((m, k)), dtype, layout, rng)
    fn(l.array, b.array)
    assert_close(b.array, ref_trsm(l.original(), b.original()), dtype)
    np.testing.assert_array_equal(l.array, l.before_tile())
    l.check_outside_untouched()
    b.check_outside_untouched()


def run_syrk(fn, rng, m: int, k: int, dtype: str, layout: str) -> None:
    a = Tile(rng.standard_normal((m, k)), dtype, layout, rng)
    c = Tile(rng.standard_normal((m, m)), dtype, layout, rng)
    fn(a.array, c.array)
    assert_close(c.array, ref_syrk(a.original(), c.original()), dtype, scale=k)
    np.testing.assert_array_equal(np.triu(c.array, 1), np.triu(c.before_tile(), 1))
    np.testing.assert_array_equal(a.array, a.before_tile())
    a.check_outside_untouched()
    c.check_outside_untouched()


def run_gemm(fn, rng, m: int, n: int, k: int, dtype: str, layout: str) -> None:
    a = Tile(rng.standard_normal((m, k)), dtype, layout, rng)
    b = Tile(rng.standard_normal((n, k)), dtype, layout, rng)
    c = Tile(rng.standard_normal((m, n)), dtype, layout, rng)
    fn(a.array, b.array, c.array)
    assert_close(c.array, ref_gemm(a.original(), b.original(), c.original()), dtype, scale=k)
    np.testing.assert_array_equal(a.array, a.before_tile())
    np.testing.assert_array_equal(b.array, b.before_tile())
    for t in (a, b, c):
        t.check_outside_untouched()


# -- the wrappers, through the declared kernels -----------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 64, 100, 129, 512])  # (recursive above 64: halves)
def test_potrf(rng, n, dtype, layout):
    run_potrf(potrf, rng, n, dtype, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k",
    # (recursive above 16 columns: halves cut at multiples of 16, and odd remainders)
    [(1, 1), (7, 7), (64, 64), (100, 100), (37, 64), (100, 3), (3, 130), (300, 200), (512, 512)],
)
def test_trsm(rng, m, k, dtype, layout):
    run_trsm(trsm, rng, m, k, dtype, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 1), (7, 7), (64, 64), (100, 100), (100, 37), (5, 64)])
def test_syrk(rng, m, k, dtype, layout):
    run_syrk(syrk, rng, m, k, dtype, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,n,k", [(1, 1, 1), (7, 7, 7), (64, 64, 64), (100, 100, 100), (37, 64, 100), (100, 5, 1)]
)
def test_gemm(rng, m, n, k, dtype, layout):
    run_gemm(gemm, rng, m, n, k, dtype, layout)


def test_mixed_layouts(rng):
    """A Fortran tile, a view and a read-only array in one call."""
    a = np.asfortranarray(rng.standard_normal((6, 4)))
    a.flags.writeable = False
    big = np.asfortranarray(rng.standard_normal((20, 20)))
    b = big[3:8, 2:6]
    c = np.asfortranarray(rng.standard_normal((6, 5)))
    want = ref_gemm(a, b, c)
    gemm(a, b, c)
    np.testing.assert_allclose(c, want, atol=1e-12)


def test_single_column_and_row_tiles(rng):
    """(m, 1) and (1, n) tiles are column-major whatever their order flag or strides."""
    a = rng.standard_normal((6, 1))  # C-ordered, strides (8, 8): ld must be 6, not 1
    b = rng.standard_normal((5, 1))
    c = np.asfortranarray(rng.standard_normal((6, 5)))
    want = ref_gemm(a, b, c)
    gemm(a, b, c)
    np.testing.assert_allclose(c, want, atol=1e-12)
    row = rng.standard_normal((1, 5))  # C-ordered, strides (40, 8)
    l = lower_factor(rng, 5)  # noqa: E741
    want = ref_trsm(l, row)
    trsm(np.asfortranarray(l), row)
    np.testing.assert_allclose(row, want, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_size_tiles_are_no_ops(dtype):
    def z(rows: int, cols: int) -> np.ndarray:
        return np.ones((rows, cols), dtype=dtype, order="F")

    potrf(z(0, 0))
    trsm(z(0, 0), z(5, 0))
    b = z(0, 4)
    trsm(z(4, 4), b)
    c = z(3, 3)
    syrk(z(3, 0), c)
    np.testing.assert_array_equal(c, 1)
    c = z(3, 2)
    gemm(z(3, 0), z(2, 0), c)
    np.testing.assert_array_equal(c, 1)
    gemm(z(0, 4), z(2, 4), z(0, 2))
    gemm(z(3, 4), z(0, 4), z(3, 0))


# -- the jitted inner functions, run as plain Python ----------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inner_py_func(rng, dtype, layout):
    def py(op: str):
        return cholesky.JITTED[op, dtype].py_func

    run_potrf(py("potrf"), rng, 7, dtype, layout)
    run_trsm(py("trsm"), rng, 5, 3, dtype, layout)
    run_syrk(py("syrk"), rng, 6, 4, dtype, layout)
    run_gemm(py("gemm"), rng, 5, 3, 4, dtype, layout)


def test_inner_py_func_reports_info(rng):
    a = np.asfortranarray(np.diag([1.0, 2.0, -1.0, 4.0]))
    assert cholesky.JITTED["potrf", "float64"].py_func(a) == 3


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", [1, 3, 8])
def test_potrf_not_positive_definite(rng, dtype, order):
    a = spd(rng, 8)
    a[order - 1, order - 1] = -50.0  # the first `order - 1` leading minors stay positive
    a = np.asfortranarray(a.astype(dtype))
    with pytest.raises(NotPositiveDefiniteError) as info:
        potrf(a)
    assert info.value.order == order
    assert f"order {order}" in str(info.value)
    assert isinstance(info.value, ArithmeticError)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", [70, 129, 200])
def test_potrf_not_positive_definite_deep_in_the_recursion(rng, dtype, order):
    a = spd(rng, 200)  # (halves of 112 and 88 columns, then their halves)
    a[order - 1, order - 1] = -1e4
    a = np.asfortranarray(a.astype(dtype))
    with pytest.raises(NotPositiveDefiniteError) as info:
        potrf(a)
    assert info.value.order == order


@pytest.mark.parametrize("where,order", [((0, 0), 1), ((2, 1), 3), ((4, 4), 5), ((1, 0), 2)])
def test_potrf_nan_is_not_positive_definite(rng, where, order):
    """As in reference LAPACK (OpenBLAS's own potrf lets NaN through)."""
    a = np.asfortranarray(spd(rng, 5))
    a[where] = np.nan
    with pytest.raises(NotPositiveDefiniteError) as info:
        potrf(a)
    assert info.value.order == order


def test_potrf_nan_in_upper_triangle_is_ignored(rng):
    a = np.asfortranarray(spd(rng, 5))
    want = ref_potrf(a)
    a[0, 3] = want[0, 3] = np.nan
    potrf(a)
    np.testing.assert_allclose(a, want, atol=1e-12)


def test_c_ordered_input_is_rejected(rng):
    a = rng.standard_normal((5, 5))  # C order
    message = r"potrf: a is not a column-major.*np\.asfortranarray\(a\)"
    with pytest.raises(ValueError, match=message):
        potrf(a)
    f = np.asfortranarray(a)
    with pytest.raises(ValueError, match=r"gemm: b is not a column-major"):
        gemm(f, a, f.copy(order="F"))
    with pytest.raises(ValueError, match=r"trsm: l is not a column-major"):
        trsm(a, f)
    with pytest.raises(ValueError, match=r"syrk: c is not a column-major"):
        syrk(f, np.ascontiguousarray(f))


def test_row_strided_view_is_rejected(rng):
    big = np.asfortranarray(rng.standard_normal((10, 10)))
    with pytest.raises(ValueError, match="column-major"):
        potrf(big[::2, ::2])


def test_mismatched_dtypes_are_rejected(rng):
    a = np.asfortranarray(rng.standard_normal((4, 4)))
    with pytest.raises(ValueError, match=r"gemm needs tiles of one dtype.*b: float32"):
        gemm(a, a.astype(np.float32, order="F"), a.copy(order="F"))
    with pytest.raises(ValueError, match="one dtype"):
        trsm(a, a.astype(np.float32, order="F"))


@pytest.mark.parametrize("dtype", ["int64", "float16", "complex128", ">f8"])
def test_unsupported_dtype_is_rejected(dtype):
    with pytest.raises(ValueError, match="float32 or float64"):
        potrf(np.eye(3, dtype=dtype, order="F"))


def test_bad_shapes_are_rejected(rng):
    f = np.asfortranarray
    with pytest.raises(ValueError, match="potrf: tile shapes do not fit"):
        potrf(f(np.ones((3, 4))))
    with pytest.raises(ValueError, match="trsm: tile shapes"):
        trsm(f(np.eye(3)), f(np.ones((5, 4))))
    with pytest.raises(ValueError, match="syrk: tile shapes"):
        syrk(f(np.ones((3, 2))), f(np.ones((4, 4))))
    with pytest.raises(ValueError, match="gemm: tile shapes"):
        gemm(f(np.ones((3, 2))), f(np.ones((4, 3))), f(np.ones((3, 4))))
    with pytest.raises(ValueError, match="2-D NumPy array"):
        potrf(np.ones(4))
    with pytest.raises(ValueError, match="2-D NumPy array"):
        gemm([[1.0]], f(np.ones((1, 1))), f(np.ones((1, 1))))


def test_read_only_output_is_rejected():
    c = np.eye(3, order="F")
    c.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        syrk(np.ones((3, 2), order="F"), c)


# -- declarations, compilation, dispatch ----------------------------------------------


def test_declarations():
    assert [k.name for k in CHOLESKY_KERNELS] == ["potrf", "trsm", "syrk", "gemm"]
    assert potrf.modes == (Mode.RW,) and potrf.dims == ("nn",)
    assert trsm.modes == (Mode.R, Mode.RW) and trsm.dims == ("kk", "mk")
    assert syrk.modes == (Mode.R, Mode.RW) and syrk.dims == ("mk", "mm")
    assert gemm.modes == (Mode.R, Mode.R, Mode.RW) and gemm.dims == ("mk", "nk", "mn")
    for k in CHOLESKY_KERNELS:
        assert k.dtypes == (np.dtype("float32"), np.dtype("float64"))
        assert k.__doc__ and k.__doc__ == k.fn.__doc__
    assert potrf.cost([(30, 30)]) == 30**3 / 3
    assert trsm.cost([(4, 4), (3, 4)]) == 3 * 4 * 4
    assert syrk.cost([(3, 4), (3, 3)]) == 3 * 3 * 4
    assert gemm.cost([(2, 4), (3, 4), (2, 3)]) == 2 * 2 * 3 * 4
    assert gemm.check([Mode.R, Mode.R, Mode.RW], [(2, 4), (3, 4), (2, 3)], ["float64"] * 3) == ""
    assert "dimension 'k'" in gemm.check(
        [Mode.R, Mode.R, Mode.RW], [(2, 4), (3, 5), (2, 3)], ["float64"] * 3
    )


def test_compile_all():
    seconds = compile_all(("float32", "float64"))
    assert set(seconds) == {"potrf", "trsm", "syrk", "gemm", "total"}
    assert all(isinstance(s, float) and s > 0 for s in seconds.values())
    assert seconds["total"] >= max(seconds[k.name] for k in CHOLESKY_KERNELS)
    with pytest.raises(ValueError, match="float32 or float64"):
        gemm.compile(["int32"])


def test_one_signature_per_dtype(rng):
    """F arrays, strided views and read-only arrays all reuse the one 'A' signature."""
    compile_all(("float32", "float64"))
    for dtype in DTYPES:
        run_gemm(gemm, rng, 4, 3, 2, dtype, "fortran")
        run_gemm(gemm, rng, 4, 3, 2, dtype, "view")
        run_syrk(syrk, rng, 3, 1, dtype, "view")
        a = np.asfortranarray(np.ones((3, 3), dtype=dtype))
        a.flags.writeable = False
        syrk(a, np.eye(3, dtype=dtype, order="F"))
    for (op, dtype), fn in cholesky.JITTED.items():
        assert fn.signatures == [tuple(cholesky.signature(op, dtype).args)], (op, dtype)
        assert fn.targetoptions["nogil"] is True


def test_kernel_runs_on_numpy_arrays(rng):
    a = np.asfortranarray(spd(rng, 6))
    want = ref_potrf(a)
    assert potrf(a) is None
    np.testing.assert_allclose(a, want, atol=1e-12)


def test_gemm_in_two_threads(rng):
    """Concurrent calls (which run without the GIL) give correct results."""
    n = 512
    tiles = [[np.asfortranarray(rng.standard_normal((n, n))) for _ in range(3)] for _ in range(2)]
    wants = [ref_gemm(a, b, c) for a, b, c in tiles]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def work(a, b, c):
        try:
            barrier.wait(timeout=30)
            gemm(a, b, c)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    gemm.compile(["float64"])
    threads = [threading.Thread(target=work, args=t) for t in tiles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    for (_, _, c), want in zip(tiles, wants):
        np.testing.assert_allclose(c, want, atol=1e-10)
