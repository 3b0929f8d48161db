"""Bar charts as SVG geometry, drawn by the templates: no chart library, no script.

Each chart also keeps its numbers, which the page lists in a table beside it, so the figures
are readable without seeing the picture (screen readers, copying)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Bar", "Chart", "bar_chart"]

WIDTH, HEIGHT, PAD = 720, 160, 24


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    css: str  # which series: the stylesheet colours it
    title: str


@dataclass
class Chart:
    title: str
    unit: str
    peak: float
    bars: list[Bar] = field(default_factory=list)
    rows: list[tuple[str, list[str]]] = field(default_factory=list)  # label, values
    series: list[str] = field(default_factory=list)
    width: int = WIDTH
    height: int = HEIGHT
    first: str = ""
    last: str = ""
    axis: str = "Hour (UTC)"  # what a label is, as the table's first column says


def bar_chart(
    title: str,
    unit: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    axis: str = "Hour (UTC)",
) -> Chart:
    """Grouped bars: one group per label, one bar per series (``None``: no value)."""
    values = [v for _, vs in series for v in vs if v is not None]
    peak = max(values, default=0.0) or 1.0
    chart = Chart(title=title, unit=unit, peak=peak, series=[name for name, _ in series], axis=axis)
    chart.first, chart.last = (labels[0], labels[-1]) if labels else ("", "")
    n = max(len(labels), 1)
    slot = (WIDTH - 2 * PAD) / n
    bar_w = max(slot * 0.8 / max(len(series), 1), 1.0)
    for i, label in enumerate(labels):
        cells = []
        for j, (name, vs) in enumerate(series):
            v = vs[i] if i < len(vs) else None
            cells.append("—" if v is None else _fmt(v))
            if not v:
                continue
            h = (HEIGHT - 2 * PAD) * v / peak
            chart.bars.append(
                Bar(
                    x=round(PAD + i * slot + slot * 0.1 + j * bar_w, 2),
                    y=round(HEIGHT - PAD - h, 2),
                    width=round(bar_w, 2),
                    height=round(h, 2),
                    css=f"s{j}",
                    title=f"{label} · {name}: {_fmt(v)}{unit}",
                )
            )
        chart.rows.append((label, cells))
    return chart


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"
