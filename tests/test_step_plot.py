"""One stalled step does not flatten the step-time plot for every other step."""

from __future__ import annotations

import pytest

from ampscope.tui.model.figures import clip_outliers
from ampscope.tui.model.run_state import RunState
from ampscope.tui.widgets.plots import StepTimePlot
from tests import helpers


@pytest.mark.unit
def test_a_stall_is_drawn_at_the_ceiling_and_said() -> None:
    ys = [500.0, 510.0, 7400.0, 495.0, 505.0]
    drawn, ceiling, clipped = clip_outliers(ys)
    assert ceiling == pytest.approx(4 * 505.0) and clipped == 1
    assert drawn == [500.0, 510.0, 2020.0, 495.0, 505.0]
    assert clip_outliers([500.0, 510.0, 520.0]) == ([500.0, 510.0, 520.0], None, 0)


@pytest.mark.unit
def test_the_step_time_plot_axis_fits_the_ordinary_steps_and_its_title_marks_the_clip() -> None:
    state = RunState()
    state.ingest(helpers.hello())
    for i, ms in enumerate([500.0, 510.0, 7400.0, 495.0, 505.0, 500.0]):
        state.ingest(helpers.step(i, ms))
    figure = StepTimePlot().figure(state, (60, 10))
    assert figure.y.hi <= 3000  # the 7.4 s step no longer sets the axis (8000 before)
    tick = figure.y.ticks[1] - figure.y.ticks[0]
    assert 0 <= figure.y.hi - 4 * 502.5 <= tick / 4  # drawn at the top: a 2500 axis wasted 20 %
    title = "".join(part if isinstance(part, str) else part[0] for part in figure.titles[0])
    assert "1 over 2010 drawn at top" in title  # 4 x the median, 502.5 ms
