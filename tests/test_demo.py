"""The demo's figures: never more than 100 % of the peak it measured."""

from __future__ import annotations

import pytest

from taskgraph.batch.demo import fraction_of_peak, report


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
