"""Student's t and its intervals (grpo_lab/stats/intervals.py): t in closed form and t intervals over seeds."""

import math

import numpy as np
import pytest

from grpo_lab.stats.intervals import mean_ci, t_975, t_cdf, t_quantile


def test_mean_ci_is_students_t():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)     # s = 1, t_{0.975, 2} = 4.303
    mean, half = mean_ci(np.array([[0.0, 2.0], [1.0, 1.0]]), axis=1)
    assert mean.tolist() == [1.0, 1.0] and half[1] == 0.0 and half[0] == pytest.approx(12.706 * 1.0, rel=1e-4)
    assert math.isnan(float(mean_ci([0.5])[1]))
    # NaN = a seed without that point: the statistics of the others
    mean, half = mean_ci(np.array([[1.0, 2.0, 3.0], [1.0, math.nan, 3.0], [math.nan, 4.0, math.nan]]), axis=1)
    assert mean.tolist() == [2.0, 2.0, 4.0] and math.isnan(half[2])
    assert half[0] == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert half[1] == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2), rel=1e-4)
    with pytest.raises(ValueError, match="not NaN"):
        mean_ci([math.nan, math.nan])
    assert t_975(100) == pytest.approx(1.984, abs=1e-3)
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_975(0)


def test_t_distribution_in_closed_form():
    assert t_cdf(0.0, 3) == 0.5 and t_cdf(1.0, 1) == pytest.approx(0.75)            # Cauchy: 1/2 + atan(1)/π
    assert t_cdf(-2.0, 4) == pytest.approx(1 - t_cdf(2.0, 4))
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)                   # printed tables
    assert t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)
    assert t_quantile(0.975, 29) == pytest.approx(2.0452, abs=1e-4)
    with pytest.raises(ValueError, match="p must lie strictly between 0 and 1"):
        t_quantile(1.0, 3)
