"""The dashboard's charts and the run graph, as geometry for the templates.

Everything here is pure (values in, numbers out): the templates draw the SVG and
escape every label, so no text from the database is ever pasted into markup here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

import attrs

#: Chart canvas, in SVG user units (the CSS scales it to the column's width).
WIDTH, HEIGHT, PAD = 600, 160, 40
INNER_W, INNER_H = WIDTH - 2 * PAD, HEIGHT - 2 * PAD  #: inside the axes' padding


@attrs.frozen
class Line:
    """A line chart: ``points`` for a ``<polyline>``, the y-axis top label, and the
    time span shown."""

    points: str
    top: float
    span: float  #: seconds from the first sample to the last
    last: float | None  #: the newest value (None: no samples yet)


@attrs.frozen
class Bar:
    x: float
    y: float
    height: float
    failed_y: float
    failed_height: float
    other_y: float
    other_height: float
    title: str


@attrs.frozen
class Bars:
    """A stacked bar chart of the executions that ended per bucket: completed,
    failed (or timed out) on top, and the others (cancelled, dropped, rejected)
    on top of those."""

    bars: tuple[Bar, ...]
    width: float  #: of each bar
    top: int
    total: int
    failed: int

    @property
    def failure_rate(self) -> float | None:
        return None if not self.total else self.failed / self.total


def _nice_top(value: float) -> float:
    """The y-axis top: 1, 2 or 5 times a power of ten, at least 1 and ``value``."""
    if value <= 1:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= value)


def line(samples: Sequence[tuple[float, float]]) -> Line:
    """``samples``: (time, value), oldest first."""
    if not samples:
        return Line(points="", top=1.0, span=0.0, last=None)
    start, end = samples[0][0], samples[-1][0]
    span = max(end - start, 1.0)
    top = _nice_top(max(value for _, value in samples))
    points = " ".join(
        f"{PAD + (t - start) / span * INNER_W:.1f},{HEIGHT - PAD - v / top * INNER_H:.1f}"
        for t, v in samples
    )
    return Line(points=points, top=top, span=end - start, last=samples[-1][1])


def bars(buckets: Sequence[tuple[float, int, int, int]]) -> Bars:
    """``buckets``: (start, completed, failed or timed out, all that ended), a
    minute each, oldest first."""
    if not buckets:
        return Bars(bars=(), width=0.0, top=1, total=0, failed=0)
    top = int(_nice_top(max(n for *_, n in buckets)))
    slot = INNER_W / len(buckets)
    out = []
    for i, (_start, ok, bad, n) in enumerate(buckets):
        other = n - ok - bad
        h_ok, h_bad, h_other = (count / top * INNER_H for count in (ok, bad, other))
        base = HEIGHT - PAD
        out.append(
            Bar(
                x=round(PAD + i * slot, 1),
                y=round(base - h_ok, 1),
                height=round(h_ok, 1),
                failed_y=round(base - h_ok - h_bad, 1),
                failed_height=round(h_bad, 1),
                other_y=round(base - h_ok - h_bad - h_other, 1),
                other_height=round(h_other, 1),
                title=(
                    f"{ok} ok, {bad} failed, {other} cancelled, dropped or rejected"
                    f" ({len(buckets) - i} min ago)"
                ),
            )
        )
    return Bars(
        bars=tuple(out),
        width=round(max(slot * 0.8, 1.0), 1),
        top=top,
        total=sum(n for *_, n in buckets),
        failed=sum(bad for _, _, bad, _ in buckets),
    )


#: A step's box and the gaps between them.
STEP_W, STEP_H, GAP_X, GAP_Y, MARGIN = 190, 40, 50, 16, 10


@attrs.frozen
class Step:
    step_id: str
    state: str
    x: int
    y: int
    detail: str = ""  #: what its task waits on, if it does


@attrs.frozen
class Graph:
    steps: tuple[Step, ...]
    edges: tuple[str, ...]  #: SVG paths ("M x y C ..."), numbers only
    width: int
    height: int
    layered: bool  #: False: no graph recorded, the steps as one column


def depths(graph: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Each step's depth: 0 without dependencies, else one more than its deepest
    dependency (one the graph does not list: depth 0). A cycle (a broken record)
    is cut where it is met; the walk keeps its own stack, so a chain of any
    length is laid out, in whatever order the graph lists its steps."""
    out: dict[str, int] = {}
    for root in graph:
        if root in out:
            continue
        visiting = {root}
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(graph.get(root, ())))]
        while stack:
            step, deps = stack[-1]
            for dep in deps:
                if dep not in out and dep not in visiting:
                    visiting.add(dep)
                    stack.append((dep, iter(graph.get(dep, ()))))
                    break
            else:
                stack.pop()
                visiting.discard(step)
                # (a dependency still being visited is the cycle's cut: depth 0)
                out[step] = 1 + max(out.get(d, 0) for d in graph[step]) if graph.get(step) else 0
    return out


def run_graph(
    graph: Mapping[str, Sequence[str]] | None,
    states: Mapping[str, str],
    details: Mapping[str, str] | None = None,
) -> Graph:
    """Lay out a run's steps left to right by dependency depth (``graph``: step id
    -> the ids it depends on), each coloured by its state in ``states`` (a step
    not there yet is ``"pending"``), with its ``details`` (what it waits on).
    Without a graph, the steps as a column."""
    details = details or {}
    deps: dict[str, list[str]] = {}
    layers: list[list[str]] = [list(states)] if states else []
    if graph is not None:
        deps = {step: list(graph[step]) for step in graph}
        for step in [*states, *itertools.chain.from_iterable(deps.values())]:
            deps.setdefault(step, [])  # (a step only in `states` or only named as a dependency)
        by_depth = depths(deps)
        layers = [[] for _ in range(max(by_depth.values(), default=-1) + 1)]
        for step in deps:  # (insertion order: the workflow's own)
            layers[by_depth[step]].append(step)
    where: dict[str, Step] = {}
    for col, layer in enumerate(layers):
        for row, step in enumerate(layer):
            where[step] = Step(
                step,
                states.get(step, "pending"),
                MARGIN + col * (STEP_W + GAP_X),
                MARGIN + row * (STEP_H + GAP_Y),
                details.get(step, ""),
            )
    edges = []
    for step, needs in deps.items():
        to = where[step]
        for dep in needs:
            fr = where[dep]
            x1, y1 = fr.x + STEP_W, fr.y + STEP_H // 2
            x2, y2 = to.x, to.y + STEP_H // 2
            mid = (x1 + x2) / 2
            edges.append(f"M{x1} {y1} C{mid:.0f} {y1} {mid:.0f} {y2} {x2} {y2}")
    rows = max((len(layer) for layer in layers), default=0)
    cols = len(layers)
    return Graph(
        steps=tuple(where.values()),
        edges=tuple(edges),
        width=max(2 * MARGIN + cols * STEP_W + max(cols - 1, 0) * GAP_X, STEP_W),
        height=max(2 * MARGIN + rows * (STEP_H + GAP_Y) - GAP_Y, STEP_H),
        layered=graph is not None,
    )
