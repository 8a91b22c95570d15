#!/usr/bin/env python3
"""Draws the throughput of each benchmark scenario beside its floor as an SVG bar chart.

Standard library only. Reads the results.tsv that scripts/bench.sh writes (a header line,
then one line per scenario, tab-separated) and writes one SVG file:

    chart.py RESULTS_TSV OUTPUT_SVG [SUBTITLE]

Every scenario measured with more than one connection gets a dark bar; when it is compared
with a floor or a baseline, that one's throughput is drawn as a light bar right under it.
"""

import csv
import sys
from xml.sax.saxutils import escape

BAR = 18          # height of one bar
GAP = 4           # between a scenario's bar and its floor's bar
ROW_GAP = 14      # between scenarios
LABEL_W = 250     # room for the scenario names
PLOT_W = 560      # longest bar
VALUE_W = 170     # room for the numbers right of the bars
TOP = 90
LEFT = 16
DARK = "#2f5d8a"
LIGHT = "#b8c9dc"
TEXT = "#1f2328"
MUTED = "#57606a"


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    shown = []
    for row in rows:
        try:
            rps = float(row["rps"])
            connections = int(row["connections"])
        except (KeyError, ValueError):
            continue  # skipped scenarios have no numbers
        if connections <= 1:
            continue  # the one-connection runs are about latency, not throughput
        ref_rps = None
        if row.get("ref") and row.get("ref_rps"):
            try:
                ref_rps = float(row["ref_rps"])
            except ValueError:
                ref_rps = None
        ratio = None
        try:
            ratio = float(row.get("ratio") or "")
        except ValueError:
            ratio = None
        shown.append((row["scenario"], rps, row.get("ref") or "", ref_rps, ratio))
    return shown


def nice_max(value):
    """The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten) at or
    above value."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def fmt(value):
    return f"{value:,.0f}"


def split_panels(rows):
    """Rows far below the fastest (under a tenth of it) get a panel and a scale of their own,
    so that the database paths are not drawn as slivers beside the HTTP floor."""
    top = max(max(r[1], r[3] or 0) for r in rows)
    fast = [r for r in rows if max(r[1], r[3] or 0) >= top / 10]
    slow = [r for r in rows if max(r[1], r[3] or 0) < top / 10]
    return [panel for panel in (fast, slow) if panel]


def render_panel(rows, y):
    """Draws one panel from height y; returns its SVG elements and the height below it."""
    top_value = nice_max(max(max(r[1], r[3] or 0) for r in rows))
    first = y
    body = []
    for name, rps, ref, ref_rps, given_ratio in rows:
        row_h = BAR if ref_rps is None else 2 * BAR + GAP
        body.append(
            f'<text x="{LEFT + LABEL_W - 10}" y="{y + row_h / 2 + 5:.1f}" text-anchor="end" '
            f'font-size="14" fill="{TEXT}">{escape(name)}</text>'
        )
        w = PLOT_W * rps / top_value
        body.append(
            f'<rect x="{LEFT + LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR}" fill="{DARK}">'
            f"<title>{escape(name)}: {fmt(rps)} req/s</title></rect>"
        )
        body.append(
            f'<text x="{LEFT + LABEL_W + w + 6:.1f}" y="{y + BAR - 5}" font-size="12" '
            f'fill="{TEXT}">{fmt(rps)}</text>'
        )
        if ref_rps is not None:
            ry = y + BAR + GAP
            rw = PLOT_W * ref_rps / top_value
            # The ratio the results give (paired within rounds), else the bars' own.
            ratio = given_ratio if given_ratio is not None else (rps / ref_rps if ref_rps else 0)
            body.append(
                f'<rect x="{LEFT + LABEL_W}" y="{ry}" width="{rw:.1f}" height="{BAR}" '
                f'fill="{LIGHT}"><title>{escape(ref)}: {fmt(ref_rps)} req/s</title></rect>'
            )
            body.append(
                f'<text x="{LEFT + LABEL_W + rw + 6:.1f}" y="{ry + BAR - 5}" font-size="12" '
                f'fill="{MUTED}">{escape(ref)} {fmt(ref_rps)} ({ratio:.2f}x)</text>'
            )
        y += row_h + ROW_GAP
    # Axis: ticks at fifths of the scale, with vertical grid lines behind the bars.
    grid = []
    for i in range(6):
        x = LEFT + LABEL_W + PLOT_W * i / 5
        grid.append(
            f'<line x1="{x:.1f}" y1="{first - 6}" x2="{x:.1f}" y2="{y - ROW_GAP + 4}" '
            f'stroke="#d0d7de" stroke-width="1"/>'
        )
        grid.append(
            f'<text x="{x:.1f}" y="{y + 10}" text-anchor="middle" font-size="11" '
            f'fill="{MUTED}">{fmt(top_value * i / 5)}</text>'
        )
    return grid + body, y + 24


def render(rows, subtitle):
    width = LEFT + LABEL_W + PLOT_W + VALUE_W
    y = TOP
    elements = []
    panels = split_panels(rows)
    for index, panel in enumerate(panels):
        if len(panels) > 1:
            caption = "requests/s" if index == 0 else "requests/s (its own scale)"
            elements.append(
                f'<text x="{LEFT}" y="{y - 14}" font-size="12" font-style="italic" '
                f'fill="{MUTED}">{caption}</text>'
            )
        drawn, y = render_panel(panel, y)
        elements += drawn
        y += 28
    height = y + 10
    legend_y = height - 20
    legend = [
        f'<rect x="{LEFT + LABEL_W}" y="{legend_y - 11}" width="14" height="12" fill="{DARK}"/>',
        f'<text x="{LEFT + LABEL_W + 20}" y="{legend_y}" font-size="12" fill="{TEXT}">'
        "scenario (requests/s)</text>",
        f'<rect x="{LEFT + LABEL_W + 190}" y="{legend_y - 11}" width="14" height="12" '
        f'fill="{LIGHT}"/>',
        f'<text x="{LEFT + LABEL_W + 210}" y="{legend_y}" font-size="12" fill="{TEXT}">'
        "its floor or baseline, and the ratio</text>",
    ]
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="28" font-size="18" font-weight="bold" fill="{TEXT}">'
        "Throughput per scenario, beside its floor</text>",
        f'<text x="{LEFT}" y="48" font-size="12" fill="{MUTED}">{escape(subtitle)}</text>',
    ]
    return "\n".join(head + elements + legend + ["</svg>", ""])


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write(__doc__)
        return 2
    rows = read_rows(argv[1])
    if not rows:
        sys.stderr.write(f"chart.py: no scenario with numbers in {argv[1]}\n")
        return 1
    subtitle = argv[3] if len(argv) == 4 else ""
    with open(argv[2], "w", encoding="utf-8") as handle:
        handle.write(render(rows, subtitle))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
