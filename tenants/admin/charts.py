"""Server-rendered SVG charts for admin pages (no JavaScript, works offline).

Every label and value goes through ``format_html``, so nothing a tenant typed can inject
markup into the page.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP = 720, 180, 48, 28, 18
COLORS = ("#417690", "#d98b2b", "#5b9a68", "#b04a4a")


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10
    return max(step, -(-value // step) * step)


def _axis(top: float, unit: str) -> SafeString:
    ticks = [(0, HEIGHT - PAD_BOTTOM), (top / 2, PAD_TOP + (HEIGHT - PAD_BOTTOM - PAD_TOP) / 2),
             (top, PAD_TOP)]
    return format_html_join(
        "", '<text x="{}" y="{}" class="kvi-tick">{}{}</text>'
            '<line x1="{}" x2="{}" y1="{}" y2="{}" class="kvi-grid"/>',
        ((PAD_LEFT - 4, y + 4, f"{v:g}", unit, PAD_LEFT, WIDTH, y, y) for v, y in ticks))


def bars(title: str, labels: Sequence[str], series: Sequence[tuple[str, Sequence[float]]],
         unit: str = "") -> SafeString:
    """Grouped bar chart: one group per label, one bar per series (None counts as 0)."""
    values = [[v or 0 for v in vals] for _, vals in series]
    top = _nice_max(max((v for vals in values for v in vals), default=0))
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    group_w = (WIDTH - PAD_LEFT) / max(1, len(labels))
    bar_w = max(1.0, group_w * 0.8 / max(1, len(series)))
    rects = []
    for s, vals in enumerate(values):
        for i, v in enumerate(vals):
            h = plot_h * v / top
            x = PAD_LEFT + i * group_w + group_w * 0.1 + s * bar_w
            rects.append((round(x, 1), round(PAD_TOP + plot_h - h, 1), round(bar_w, 1),
                          round(h, 1), COLORS[s % len(COLORS)], labels[i], series[s][0],
                          f"{v:g}"))
    body = format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                                "<title>{}: {} {}</title></rect>", rects)
    return format_html(
        '<figure class="kvi-chart"><figcaption>{}</figcaption>'
        '<svg viewBox="0 0 {} {}" width="100%" role="img" aria-label="{}">{}{}{}</svg>'
        "<div>{}</div></figure>",
        title, WIDTH, HEIGHT, title, _axis(top, unit), body, _xlabels(labels, group_w),
        _legend(series))


def _xlabels(labels: Sequence[str], group_w: float) -> SafeString:
    every = max(1, len(labels) // 8)
    return format_html_join(
        "", '<text x="{}" y="{}" class="kvi-tick" text-anchor="middle">{}</text>',
        ((round(PAD_LEFT + (i + 0.5) * group_w, 1), HEIGHT - 8, label[-5:])
         for i, label in enumerate(labels) if i % every == 0))


def _legend(series) -> SafeString:
    return format_html_join(
        " ", '<span class="kvi-key"><i style="background:{}"></i>{}</span>',
        ((COLORS[i % len(COLORS)], name) for i, (name, _) in enumerate(series)))
