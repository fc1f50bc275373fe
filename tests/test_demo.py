"""The demo's figures (never more than 100 % of the peak it measured, enough digits
for a tiny run) and its options: a bad value is refused before any rank starts."""

from __future__ import annotations

import numpy as np
import pytest

from taskgraph import calibrate
from taskgraph.batch import demo
from taskgraph.batch.demo import SHORT_RUN_S, fraction_of_peak, long_enough_n, report

pytestmark = pytest.mark.timeout(60)


def test_a_run_faster_than_the_measured_peak_is_a_measurement_error_not_a_fraction():
    assert fraction_of_peak(109.0, 100.0) == (None, True)
    assert fraction_of_peak(50.0, 100.0) == (0.5, False)
    assert fraction_of_peak(100.0, 100.0) == (1.0, False)
    assert fraction_of_peak(5.0, 0.0) == (None, True)


@pytest.mark.parametrize("noisy", [False, True])
def test_the_printed_fraction_says_when_the_peak_was_noisy(capsys, noisy):
    fraction, flagged = fraction_of_peak(109.0 if noisy else 90.0, 100.0)
    result = {
        "n": 512,
        "tile": 128,
        "dtype": "float64",
        "tasks": 20,
        "ranks": 2,
        "workers_per_rank": 1,
        "threads": 2,
        "oversubscribed": False,
        "seconds": 0.1,
        "compile_seconds": 1.0,
        "gflops": 109.0 if noisy else 90.0,
        "gemm_peak_gflops": 100.0,
        "fraction_of_peak": fraction,
        "peak_error": flagged,
        "peak_rss_mib": [100.0, 100.0],
        "matrix_share_mib": [1.0, 1.0],
        "residual": None,
        "machine": {"cores": 2},
    }
    report(result, True, False)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("fraction"))
    if noisy:
        assert "%" not in line and "measurement error" in line, line
    else:
        assert "90.0% of peak" in line and "error" not in line, line


BAD = [
    (["--n", "0"], "--n", "at least 1 (got 0)"),
    (["--n", "-5"], "--n", "at least 1 (got -5)"),
    (["--n", "-5", "--tile", "128"], "--n", "at least 1 (got -5)"),
    (["--n", "x"], "--n", "at least 1 (got x)"),
    (["--tile", "0"], "--tile", "at least 1 (got 0)"),
    (["--tile", "-100"], "--tile", "at least 1 (got -100)"),
    (["--workers", "-1"], "--workers", "at least 1 (got -1)"),
    (["--workers", "0"], "--workers", "at least 1 (got 0)"),
    (["--repeat", "0"], "--repeat", "at least 1 (got 0)"),
    (["--repeat", "-2"], "--repeat", "at least 1 (got -2)"),
    (["--timeout", "0"], "--timeout", "above 0 (got 0)"),
    (["--timeout", "-5"], "--timeout", "above 0 (got -5)"),
    (["--timeout", "nan"], "--timeout", "above 0 (got nan)"),
    (["--ranks", "0"], "--ranks", "at least 1 (got 0)"),
    (["--seed", "-1"], "--seed", "at least 0 (got -1)"),
]


@pytest.mark.parametrize("argv, option, allowed", BAD)
def test_a_bad_value_is_one_line_naming_the_option_and_its_range(capsys, argv, option, allowed):
    """--workers -1 ran on "-2 cores", --repeat 0 ran once, --n 0 divided by zero."""
    with pytest.raises(SystemExit) as stop:
        demo.parser().parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.count("\n") == 1 and err.startswith(f"taskgraph demo: argument {option}: "), err
    assert allowed in err, err


def test_good_values_still_parse():
    args = demo.parser().parse_args(["--n", "1", "--tile", "1", "--workers", "1", "--seed", "0"])
    assert (args.n, args.tile, args.workers, args.seed, args.repeat) == (1, 1, 1, 0, 1)
    assert demo.parser().parse_args(["--timeout", "0.5"]).timeout == 0.5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv", [["--n", "0"], ["--n", "-5", "--tile", "128"], ["--tile", "-100"]])
def test_the_command_refuses_a_bad_value_before_any_rank_starts(run_cli, argv):
    """These gave a traceback per rank and MPI_Abort (exit code 1)."""
    proc = run_cli("demo", *argv, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "MPI_Abort" not in proc.stderr


def test_a_tile_larger_than_n_is_clamped_and_one_task_says_it_leaves_ranks_idle():
    """--n 1000 --tile 2000 ran one task and said only "18.5% of peak"."""
    tile, notes = demo.fit_tile(1000, 2000, threads=2)
    assert tile == 1000 and "clamped to 1000" in notes[0]
    assert "one task" in notes[1] and "1 of the 2 threads" in notes[1]
    assert demo.fit_tile(1000, 1000, threads=2)[1][0].startswith("the matrix is one tile")
    assert demo.fit_tile(1000, 1000, threads=1) == (1000, [])  # (one thread: nothing idle)
    assert demo.fit_tile(4096, 512, threads=2) == (512, [])


def test_figures_keep_their_digits_when_small():
    assert demo.figure(0.02562, 2) == 0.0256 and demo.figure(26.444, 2) == 26.44
    assert demo.figure(0.000221, 3) == 0.000221 and demo.figure(0.4561, 3) == 0.456
    assert demo.figure(0.0, 2) == 0.0
    assert demo.shown(0.02562) == "0.0256" and demo.shown(26.44) == "26.4"


def test_a_tiny_run_prints_its_speed_with_digits_and_its_notes(capsys):
    """--n 100 printed "speed 0.0 GFLOP/s, fraction 0.0% of peak"."""
    result = {
        "n": 100,
        "tile": 100,
        "dtype": "float64",
        "tasks": 1,
        "ranks": 2,
        "workers_per_rank": 1,
        "threads": 2,
        "oversubscribed": False,
        "seconds": 0.0132,
        "compile_seconds": 1.0,
        "gflops": 0.0256,
        "gemm_peak_gflops": 118.0,
        "fraction_of_peak": 0.000217,
        "peak_error": False,
        "notes": ["13.2 ms is too short to time the kernels"],
        "peak_rss_mib": [100.0, 100.0],
        "matrix_share_mib": [1.0, 1.0],
        "residual": None,
        "machine": {"cores": 2},
    }
    report(result, True, False)
    out = capsys.readouterr().out
    assert "(1 task)" in out
    assert "speed           0.0256 GFLOP/s" in out and "0.0217% of peak" in out, out
    assert "note            13.2 ms is too short to time the kernels" in out


@pytest.mark.parametrize("n,seconds", [(2048, 0.0286), (2048, 0.099), (64, 0.013), (4000, 0.05)])
def test_a_run_too_short_to_time_suggests_a_larger_order(n, seconds):
    """It said "try --n 2048 or more" to runs at n = 2048."""
    got = long_enough_n(n, seconds)
    assert got > n and got % 1024 == 0
    assert (got / n) ** 3 * seconds >= 2 * SHORT_RUN_S * 0.99


def test_the_demo_knows_when_a_calibration_is_cached(tmp_path, monkeypatch):
    """It must say "calibrating" exactly when calibrate.measurements will measure."""
    monkeypatch.setenv("TASKGRAPH_CACHE", str(tmp_path))
    measured = []

    def measure(dtype):
        measured.append(dtype)
        speeds = {b: dict.fromkeys(calibrate.FLOPS, 9.0) for b in calibrate.CANDIDATES}
        return {"peak": 10.0, "speeds": speeds}

    monkeypatch.setattr(calibrate, "measure", measure)
    assert not calibrate.cached(np.float64)
    calibrate.measurements(np.float64)
    assert measured and calibrate.cached(np.float64) and not calibrate.cached(np.float32)
    calibrate.measurements(np.float64)
    assert len(measured) == 1  # (read from the cache: the demo said nothing)
    next(tmp_path.glob("tiles-*.json")).write_text("{")  # (corrupt: measured again)
    assert not calibrate.cached(np.float64)
    next(tmp_path.glob("tiles-*.json")).write_text('{"peak": 10, "speeds": {"-5": {}}}')
    assert not calibrate.cached(np.float64)  # (whole JSON, but not whole: measured again)


@pytest.mark.timeout(240)
def test_a_first_run_says_it_calibrates_and_the_next_does_not(run_cli, tmp_path):
    """A first demo spent 3-5 s calibrating without a word: it looked stuck."""
    env = {"TASKGRAPH_CACHE": str(tmp_path)}
    says = "calibrating tile sizes for this machine, once"
    argv = ("demo", "--ranks", "1", "--workers", "1", "--n", "256", "--no-check")
    first = run_cli(*argv, timeout=200, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(says), first.stdout
    again = run_cli(*argv, timeout=200, env=env)
    assert again.returncode == 0, again.stderr
    assert says not in again.stdout and "chosen by calibration" in again.stdout
