"""Pictures of the report module that the simulation report does not draw."""

from __future__ import annotations

import pytest
from PIL import Image

from rollmux.report import plots
from rollmux.report.plots import frontier_plot


def test_a_frontier_picture_names_every_setting_and_shows_the_bars_however_far_the_points_are(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots.plt, "close", drawn.append)  # keep the figure to look at
    points = [("2 h, $10", 1.7, 7.5), ("2 h, $0", 3.6, 4.5)]
    path = frontier_plot(points, tmp_path / "gap.png", "gap", ("moves", "gap (%)"), (2.0, 3.0, "below"), "bars met")
    with Image.open(path) as picture:
        assert picture.format == "PNG"
    (ax,) = drawn[0].axes
    assert [t.get_text() for t in ax.texts] == ["2 h, $10", "2 h, $0"]
    low, high = ax.get_ylim()
    assert low <= 3.0 < 4.5 < 7.5 <= high  # the gap bar is in the picture, below every point
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["bars met"]


def test_a_frontier_target_on_no_side_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="'left'"):
        frontier_plot([("a", 1.0, 1.0)], tmp_path / "f.png", "t", ("x", "y"), (2.0, 3.0, "left"), "bars")
    assert not (tmp_path / "f.png").exists()
