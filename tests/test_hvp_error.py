"""experiments/hvp_error.py: HF's Hessian term against the exact one, on real MNIST."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import experiment_script


@pytest.fixture(scope="module")
def script():
    yield from experiment_script("hvp_error")


def test_hf_is_close_to_exact_on_unit_inputs_and_meaningless_on_raw_ones_with_fixed_delta(script):
    unit = script.trajectory_errors("mnist-tau10-alpha0.01", "unit", "fixed", 1, 2)
    raw = script.trajectory_errors("mnist-tau10-alpha0.01", "raw", "fixed", 1, 2)
    normalized = script.trajectory_errors("mnist-tau10-alpha0.01", "raw", "normalized", 1, 1)
    assert len(unit) == 2 * 10 and {r["user"] for r in unit} == {0, 25}
    # 0.006 at most with the row's delta = 0.001; ten times that delta gives 0.02, which
    # a bound of 0.1 would let pass
    assert max(r["relative_error"] for r in unit) < 0.01
    # Raw pixels: ||g|| in the thousands, so w +- delta g leaves the region where the
    # difference means anything; delta / ||g|| brings the first step back.
    assert raw[0]["grad_norm"] > 100 and raw[0]["relative_error"] > 1
    assert normalized[0]["relative_error"] < 0.1
    table = script.summarise(pd.DataFrame(unit + raw))
    assert "| mnist-tau10-alpha0.01 | unit | fixed | 20 (0) |" in table
