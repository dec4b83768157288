"""A drift report as one self-contained HTML file: the verdict, the table, one inline SVG per column.

No scripts, no external fonts or images: the file opens offline and can be attached to a ticket
or an e-mail as is. Column names and category values come from user files, so every piece of
text goes through :func:`html.escape`. Plots are drawn by hand as SVG (no matplotlib import):
overlaid histograms on shared bins for numbers, paired bars for the most frequent categories,
and for embeddings the histogram of each side projected on the line between the two means.
Untestable columns and non-finite alerts are shown as such (never as "no"); values near the ends
of float64 are scaled by a power of two before binning, and a column that still cannot be drawn
gets no picture rather than breaking the page.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpufleet.quality.drift import ColumnDrift, DriftReport, clean_column, columns_of, power_of_two_scale

REF_COLOUR, CUR_COLOUR = "#4C72B0", "#DD8452"
WIDTH, HEIGHT, PAD = 360, 150, 24
TOP_CATEGORIES = 12

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem;color:#222;max-width:1100px}
h1{font-size:1.4rem} .verdict{font-size:1.1rem;padding:.6rem 1rem;border-radius:6px;display:inline-block}
.drift{background:#fde2e1;color:#8a1c14} .nodrift{background:#e3f4e1;color:#1d5c1a} .none{background:#eee}
.incomplete{background:#fff3cd;color:#7a5a00} .alert{color:#8a1c14;font-weight:bold}
table{border-collapse:collapse;margin:1rem 0;font-size:.9rem} th,td{padding:.25rem .6rem;text-align:left}
th{border-bottom:2px solid #999} td{border-bottom:1px solid #ddd}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.cols{display:flex;flex-wrap:wrap;gap:1.2rem} figure{margin:0} figcaption{font-size:.85rem;margin-bottom:.2rem}
.legend span{display:inline-block;width:.8rem;height:.8rem;margin:0 .3rem 0 .8rem;vertical-align:middle}
"""


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _bars(ref: Sequence[float], cur: Sequence[float], labels: Sequence[str]) -> str:
    """Paired bars (reference left, current right) of two share vectors, one pair per label."""
    top = max([*ref, *cur, 1e-12])
    slot = (WIDTH - 2 * PAD) / max(len(labels), 1)
    parts = []
    for i, (r, c) in enumerate(zip(ref, cur, strict=True)):
        x = PAD + i * slot
        for j, (share, colour) in enumerate(((r, REF_COLOUR), (c, CUR_COLOUR))):
            h = (HEIGHT - 2 * PAD) * share / top
            parts.append(
                f'<rect x="{x + j * slot / 2:.1f}" y="{HEIGHT - PAD - h:.1f}" width="{max(slot / 2 - 1, 0.5):.1f}" '
                f'height="{h:.1f}" fill="{colour}" fill-opacity="0.8"><title>{html.escape(labels[i])}: '
                f"{'reference' if j == 0 else 'current'} {share:.1%}</title></rect>"
            )
    return "".join(parts)


def _axis(low: str, high: str) -> str:
    y = HEIGHT - PAD
    return (
        f'<line x1="{PAD}" y1="{y}" x2="{WIDTH - PAD}" y2="{y}" stroke="#888"/>'
        f'<text x="{PAD}" y="{y + 14}" font-size="10">{html.escape(low)}</text>'
        f'<text x="{WIDTH - PAD}" y="{y + 14}" font-size="10" text-anchor="end">{html.escape(high)}</text>'
    )


def _svg(body: str, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(label)}">{body}</svg>'
    )


def _numeric_plot(ref: NDArray[Any], cur: NDArray[Any], bins: int = 30) -> str:
    scale = power_of_two_scale(ref, cur)  # bins over +-1e308 would span an infinite range
    edges = np.histogram_bin_edges(np.concatenate([ref * scale, cur * scale]), bins=bins)
    r, c = np.histogram(ref * scale, edges)[0] / ref.size, np.histogram(cur * scale, edges)[0] / cur.size
    edges = edges / scale
    labels = [f"{lo:.4g} to {hi:.4g}" for lo, hi in itertools.pairwise(edges)]
    return _bars(list(r), list(c), labels) + _axis(f"{edges[0]:.4g}", f"{edges[-1]:.4g}")


LABEL_CHARS = 80
"""A category is drawn under its first characters: a 1 MiB label would make every array of labels 1 MiB wide."""


def _categorical_plot(ref: NDArray[Any], cur: NDArray[Any]) -> str:
    ref, cur = _short_labels(ref), _short_labels(cur)
    keys, counts = np.unique(np.concatenate([ref, cur]), return_counts=True)
    top = [str(k) for k in keys[np.argsort(-counts, kind="stable")][:TOP_CATEGORIES]]
    r = [float(np.mean(ref == k)) for k in top]
    c = [float(np.mean(cur == k)) for k in top]
    more = f"+{keys.size - len(top)} more" if keys.size > len(top) else ""
    return _bars(r, c, top) + _axis(f"top {len(top)} categories", more)


def _short_labels(values: NDArray[Any]) -> NDArray[Any]:
    """Labels cut to :data:`LABEL_CHARS` (an object array: no fixed-width copy of the longest one)."""
    return np.array([str(v)[:LABEL_CHARS] for v in values.tolist()], dtype=object)


def _embedding_plot(ref: NDArray[Any], cur: NDArray[Any]) -> str:
    scale = power_of_two_scale(ref, cur)  # means and projections of huge rows would overflow
    ref, cur = ref * scale, cur * scale
    direction = cur.mean(axis=0) - ref.mean(axis=0)
    norm = float(np.linalg.norm(direction))
    direction = direction / norm if norm > 0 else np.eye(ref.shape[1])[0]
    return _numeric_plot(ref @ direction, cur @ direction)


def column_svg(ref_raw: Any, cur_raw: Any, column: str) -> str:
    """One column's picture, or an empty string when a side has nothing to draw."""
    (ref_kind, ref), (cur_kind, cur) = clean_column(ref_raw), clean_column(cur_raw)
    if ref_kind is None or ref_kind != cur_kind or ref.shape[0] == 0 or cur.shape[0] == 0:
        return ""
    try:
        with np.errstate(all="ignore"):
            if ref_kind == "numeric":
                body = _numeric_plot(ref, cur)
            elif ref_kind == "categorical":
                body = _categorical_plot(ref, cur)
            elif ref.shape[1:] == cur.shape[1:]:
                body = _embedding_plot(ref, cur)
            else:
                return ""
    except (ArithmeticError, ValueError):  # values no binning can place: the table says why
        return ""
    return _svg(body, f"distribution of {column}")


def _non_finite(c: ColumnDrift) -> str:
    """``"0% / 50%"``: each side's share of non-finite values (``-`` where the column is absent)."""
    cells = []
    for side in ("reference", "current"):
        tally = c.non_finite.get(side)
        cells.append("-" if tally is None else ("0%" if tally.share == 0 else f"{tally.share:.1%}"))
    return " / ".join(cells)


def _verdict(c: ColumnDrift) -> str:
    if c.drift is None:
        return c.status
    return "drift" if c.drift else "no drift"


def _row(c: ColumnDrift) -> str:
    drift = {True: "<b>drift</b>", False: "no"}[c.drift] if c.drift is not None else c.status
    if c.status == "untestable":
        drift = '<span class="alert">untestable</span>'
    share = html.escape(_non_finite(c))
    notes = [html.escape(c.reason or "")]
    if c.alert:
        notes.append(f'<span class="alert">alert: {html.escape(c.alert)}</span>')
    cells = [
        html.escape(c.column),
        c.kind,
        html.escape(c.method),
        f'<td class="num">{_fmt(c.statistic)}</td>',
        f'<td class="num">{_fmt(c.p_value)}</td>',
        f'<td class="num">{_fmt(c.threshold if c.status == "ok" else None)}</td>',
        drift,
        f'<td class="num alert">{share}</td>' if c.alert else f'<td class="num">{share}</td>',
        " ".join(n for n in notes if n),
    ]
    return "<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in cells) + "</tr>"


def render_html(report: DriftReport, reference: Any, current: Any, *, title: str = "Drift report") -> str:
    """The whole report as one HTML document (a string; the caller writes it)."""
    ref_cols, cur_cols = columns_of(reference, "reference"), columns_of(current, "current")
    css = {"drift": "drift", "no_drift": "nodrift", "incomplete": "incomplete"}.get(report.status, "none")
    head = ["column", "kind", "method", "statistic", "p-value", "threshold", "drift", "non-finite ref / cur", "note"]
    figures = []
    for c in report.columns:
        svg = (
            column_svg(ref_cols[c.column], cur_cols[c.column], c.column)
            if c.column in ref_cols.keys() & cur_cols.keys()
            else ""
        )
        if svg:
            verdict = _verdict(c)
            caption = f"{html.escape(c.column)}: {html.escape(c.method)} {_fmt(c.statistic)} ({verdict})"
            figures.append(f"<figure><figcaption>{caption}</figcaption>{svg}</figure>")
    legend = (
        f'<p class="legend">bars: share of rows<span style="background:{REF_COLOUR}"></span>reference'
        f'<span style="background:{CUR_COLOUR}"></span>current</p>'
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>',
            f"<style>{_STYLE}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f'<p class="verdict {css}">{html.escape(report.verdict)}</p>',
            "<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>",
            *(_row(c) for c in report.columns),
            "</tbody></table>",
            legend,
            '<div class="cols">',
            *figures,
            "</div></body></html>",
        ]
    )


__all__ = ["TOP_CATEGORIES", "column_svg", "render_html"]
