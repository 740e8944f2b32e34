"""Reports of suite runs: Markdown and a self-contained HTML page with plots, for one run or several
side by side (ablations such as profiling none / immediate / delayed).

The plots are drawn with matplotlib into SVG (text kept as text, no fonts or images fetched), put
inline in the HTML page and written as files beside the Markdown, which links them. The page loads
nothing from the network and runs no script. matplotlib is imported only here, so the GPU side of
the project (evaluation, bench --evaluate) never needs it.

    speedups      per-task speedups vs eager and vs torch.compile, one row of dots per run
    fast_p        the fraction of tasks correct and faster than p, as p grows (both baselines)
    sol           fraction of the reference algorithm's work bound, tasks ranked (runs measured on a GPU)
    cost          dollars (or, for recorded replies, model calls) and GPU seconds per task
    budget        per run (search strategy): the mean best speedup reached against the model calls
                  and the GPU seconds spent per task, so a user can pick a budget
    trajectories  per task: speedup by agent step, best so far, markers for the stage of each step
                  (generate, repair, optimize), failed steps on the bottom band, and a star where
                  the prompt carried profiler feedback

The outputs of one agent run (`write_outputs`: best/<task>.py, summary.json and report.md) are
written here too, at the end of each session.

Besides the plots, each agent task's search tree (which proposal led where: a step under the
candidate it started from, with its outcome and the idea the model said it tried) is listed.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from cutegen.bench import budget_curve, fast_p, geomean, primary_results, search_tree, trajectory
from cutegen.config import AgentConfig
from cutegen.journal import Journal, load_run, task_file_name
from cutegen.prompt import render_template
from cutegen.records import BenchRun, BenchTaskResult, GroupSummary, to_json

REPORT_MD = "bench-report.md"
REPORT_HTML = "bench-report.html"
PLOTS_DIR = "plots"
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_STAGE_MARKERS = {"generate": ("o", "generate"), "repair_build": ("^", "repair (build)"),
                  "repair_correctness": ("v", "repair (correctness)"), "optimize": ("s", "optimize")}
_BAR_LIMIT = 40  # above this many tasks, per-task bars become a ranked curve


@dataclass(frozen=True)
class Plot:
    """One figure of a report: a file name stem, a title, its inline SVG and a caption."""

    name: str
    title: str
    svg: str
    caption: str


@dataclass(frozen=True)
class Series:
    """One run as the report shows it."""

    label: str
    color: str
    run: BenchRun

    @property
    def backend(self) -> str:
        """What the run's candidates were judged as (cute, cuda or torch): two runs of one suite under
        two backends are the CuTe-or-plain-CUDA ablation, and every table names it."""
        return str(self.run.evaluation.get("backend") or "-")

    @property
    def heading(self) -> str:
        """The label with the backend, unless the label already names it (runs that differ by it)."""
        return self.label if f"backend={self.backend}" in self.label else f"{self.label} ({self.backend})"


# ------------------------------------------------------------------------------ entry point


def write_report(runs: list[BenchRun], out_dir: Path) -> tuple[Path, Path]:
    """bench-report.md, bench-report.html and plots/*.svg in `out_dir`; the two report paths."""
    out_dir = Path(out_dir)
    (out_dir / PLOTS_DIR).mkdir(parents=True, exist_ok=True)
    series = [Series(label, _COLORS[i % len(_COLORS)], run) for i, (label, run) in enumerate(zip(run_labels(runs), runs))]
    plots = summary_plots(series)
    trajectories = trajectory_plots(series)
    for plot in plots + trajectories:
        (out_dir / PLOTS_DIR / f"{plot.name}.svg").write_text(plot.svg, encoding="utf-8")
    context = {**_context(series, plots, trajectories), "trees": search_trees(series)}
    md_path, html_path = out_dir / REPORT_MD, out_dir / REPORT_HTML
    md_path.write_text(_render("report/report.md.j2", **context), encoding="utf-8")
    html_path.write_text(_render("report/report.html.j2", **context), encoding="utf-8")
    return md_path, html_path


def run_labels(runs: list[BenchRun]) -> list[str]:
    """The run id, plus what sets a run apart from the others: its kind when kinds differ, else the
    model and the settings every run has but not all share (e.g. profiling=none)."""
    if len(runs) < 2:
        return [run.run_id for run in runs]
    if len({run.kind for run in runs}) > 1:
        return [f"{run.run_id} ({run.kind})" for run in runs]
    flats = [{**_flat("", run.agent), **_flat("eval.", run.evaluation), "model": run.model} for run in runs]
    shared = set.intersection(*({k for k, v in flat.items() if v is not None} for flat in flats))
    differing = sorted(k for k in shared if len({repr(flat[k]) for flat in flats}) > 1)
    labels = []
    for run, flat in zip(runs, flats):
        parts = [f"{k}={flat[k]}" for k in differing[:3]]
        labels.append(f"{run.run_id} ({', '.join(parts)})" if parts else run.run_id)
    return labels


def _flat(prefix: str, data: Any) -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(f"{prefix}{key}.", value) if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out
    return {prefix.rstrip("."): data}


# ------------------------------------------------------------------------------ template context


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cutegen", "templates"), undefined=jinja2.StrictUndefined,
        autoescape=lambda name: bool(name) and name.endswith(".html.j2"), trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(x=_fmt_x, pct=_fmt_pct, frac=_fmt_frac, usd=_fmt_usd, num=_fmt_num)
    env.globals["row"] = summary_rows
    env.globals["outcome"] = task_outcome
    return env


def _render(name: str, **context: Any) -> str:
    return _environment().get_template(name).render(**context)


def _context(series: list[Series], plots: list[Plot], trajectories: list[Plot]) -> dict[str, Any]:
    groups = list(dict.fromkeys(g.group for s in series for g in s.run.summary))
    summary = {g: [next((x for x in s.run.summary if x.group == g), None) for s in series] for g in groups}
    task_ids = list(dict.fromkeys(r.task_id for s in series for r in primary_results(s.run.results)))
    tasks = {t: [next((r for r in primary_results(s.run.results) if r.task_id == t), None) for s in series]
             for t in task_ids}
    primary = {id(r) for s in series for r in primary_results(s.run.results)}
    samples = [(s, r) for s in series for r in s.run.results if id(r) not in primary]
    return {"series": series, "groups": groups, "summary": summary, "tasks": tasks, "plots": plots,
            "trajectories": trajectories, "extra_samples": samples, "recorded": any(s.run.recorded for s in series)}


def _fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _fmt_frac(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fmt_usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}" if value < 10 else f"${value:.2f}"


def _fmt_num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


# ------------------------------------------------------------------------------ figures


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # lazy: only the plots need matplotlib

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any, name: str, title: str) -> str:
    """The figure as an SVG element that can sit inline in a page beside others: the XML prologue and
    metadata dropped, and every id prefixed (matplotlib numbers ids per figure, so two figures in one
    page would otherwise share `axes_1`, clip paths and marker definitions)."""
    import matplotlib  # lazy: only the plots need matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name, "font.family": "sans-serif"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", name) + "-"
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", text)
    text = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m.group(1)}"', text)
    label = title.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return text.replace("<svg ", f'<svg class="plot" role="img" aria-label="{label}" ', 1)


def _log_axis(axis: Any, suffix: str = "x") -> None:
    """Log-scale ticks at 1, 2 and 5 per decade, labelled plainly (0.5x, 1x, 2x), not as powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # lazy: only the plots need matplotlib

    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}{suffix}"))
    axis.set_minor_formatter(NullFormatter())


def _plot(fig: Any, name: str, title: str, caption: str) -> Plot:
    return Plot(name, title, _svg(fig, name, title), caption)


def summary_plots(series: list[Series]) -> list[Plot]:
    plots = [speedup_plot(series), fast_p_plot(series), cost_plot(series)]
    optional = (sol_plot(series), budget_plot(series))
    return plots + [plot for plot in optional if plot is not None]


def search_trees(series: list[Series]) -> list[dict[str, Any]]:
    """Each agent task's steps as a tree (`bench.search_tree`), one line of text per step."""
    trees = []
    for s in series:
        for result in primary_results(s.run.results):
            if result.trajectory:
                lines = tree_lines(result.trajectory)
                trees.append({"task_id": result.task_id, "label": s.label, "color": s.color,
                              "search": s.run.agent.get("search", "single"), "lines": lines})
    return trees


def tree_lines(points: tuple[Any, ...]) -> list[tuple[int, str]]:
    """A trajectory as its search tree (`bench.search_tree`): (depth, one line of text) per step."""
    return [(depth, tree_line(point)) for depth, point in search_tree(points)]


def tree_line(p: Any) -> str:
    parts = [f"#{p.index} {p.stage}" + (f" (round {p.round})" if p.round else "")]
    parts.append(f"{p.candidate_sha256[:8]}: {p.outcome}" if p.candidate_sha256 else p.outcome)
    if p.speedup_vs_eager:
        parts.append(f"{p.speedup_vs_eager:.3g}x eager")
    if p.improved:
        parts.append("new best")
    text = ", ".join(parts)
    return f"{text}. Idea: {p.idea}" if p.idea else text


def budget_plot(series: list[Series]) -> Plot | None:
    """Per run: the mean over its tasks of the best speedup vs eager reached within a budget of model
    calls (left) or GPU seconds (right) per task, 0 until a task has a correct kernel; None when no
    run recorded its spending."""
    panels = (("llm_calls", "model calls per task"), ("gpu_s", "GPU seconds per task"))
    drawn = False
    fig = _figure(9.0, 3.2)
    axes = fig.subplots(1, 2)
    for ax, (field, label) in zip(axes, panels):
        for s in series:
            tasks = [r for r in primary_results(s.run.results) if r.trajectory]
            curves = [budget_curve(r.trajectory, field) for r in tasks]
            if not any(curves):
                continue
            end = max(getattr(r, field) or 0.0 for r in tasks)
            xs = sorted({x for curve in curves for x, _ in curve} | {float(end)})
            ys = [sum(_reached(curve, x) for curve in curves) / len(curves) for x in xs]
            ax.step([0.0] + xs, [0.0] + ys, where="post", color=s.color, linewidth=1.6,
                    label=f"{_short(s.label, 30)} ({s.run.agent.get('search', 'single')})")
            drawn = True
        ax.axhline(1.0, color="#555555", linewidth=0.8, linestyle=":")
        ax.set_xlabel(label)
        ax.set_ylabel("mean best speedup vs eager")
        ax.grid(alpha=0.3)
    if not drawn:
        return None
    axes[0].legend(fontsize=7, loc="lower right")
    return _plot(fig, "budget", "Best speedup against budget",
                 "Mean over the tasks of the best speedup vs eager reached within a budget of model calls"
                 " (left) or GPU seconds (right) spent on the task (0 until it has a correct kernel), one"
                 " line per run and search strategy: where a line flattens, more budget bought little.")


def _reached(curve: list[tuple[float, float]], spent: float) -> float:
    return max((speedup for x, speedup in curve if x <= spent), default=0.0)


def speedup_plot(series: list[Series]) -> Plot:
    """Each correct task's speedup as a dot, one row per run, against both baselines (log scale)."""
    fig = _figure(9.0, 1.4 + 0.45 * len(series))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, field, name in zip(axes, ("speedup_vs_eager", "speedup_vs_compile"), ("eager PyTorch", "torch.compile")):
        if not any(getattr(r, field) for s in series for r in s.run.results):
            ax.text(0.5, 0.5, f"no speedup vs {name} measured", transform=ax.transAxes, ha="center", va="center",
                    color="#777777")
            ax.set_xticks([])
            ax.set_xlabel(f"speedup vs {name}")
            continue
        for row, s in enumerate(series):
            values = [getattr(r, field) for r in primary_results(s.run.results)
                      if r.correctness and getattr(r, field)]
            jitter = [row + 0.25 * math.sin(7.3 * i) for i in range(len(values))]
            ax.scatter(values, jitter, s=18, color=s.color, alpha=0.75, edgecolors="none")
            mean = geomean(values)
            if mean is not None:
                ax.plot([mean, mean], [row - 0.38, row + 0.38], color=s.color, linewidth=2.2)
        ax.axvline(1.0, color="#555555", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        _log_axis(ax.xaxis)
        ax.set_xlabel(f"speedup vs {name}")
        ax.set_ylim(-0.6, len(series) - 0.4)
        ax.grid(axis="x", alpha=0.3, which="both")
    axes[0].set_yticks(range(len(series)), [_short(s.label) for s in series])
    return _plot(fig, "speedups", "Speedup per task",
                 "Each dot is a correct task; the bar is the geometric mean; the dotted line is 1x.")


def fast_p_plot(series: list[Series]) -> Plot:
    """fast_p as p grows: solid vs eager, dashed vs torch.compile."""
    import numpy as np  # lazy: only this plot needs numpy

    speeds = [getattr(r, f) for s in series for r in s.run.results for f in ("speedup_vs_eager", "speedup_vs_compile")
              if getattr(r, f)]
    top = max([4.0] + [1.25 * v for v in speeds])
    grid = np.geomspace(0.05, top, 240)
    fig = _figure(6.5, 3.6)
    ax = fig.subplots()
    for s in series:
        tasks = primary_results(s.run.results)
        for baseline, style in (("eager", "-"), ("compile", "--")):
            if not any(getattr(r, f"speedup_vs_{baseline}") for r in tasks):
                continue  # not measured: a flat zero would read as "never faster"
            ax.plot(grid, [fast_p(tasks, float(p), baseline) or 0.0 for p in grid], style, color=s.color,
                    linewidth=1.6, label=f"{_short(s.label)} vs {'eager' if baseline == 'eager' else 'torch.compile'}")
    for p in (1.0, 2.0):
        ax.axvline(p, color="#888888", linewidth=0.7, linestyle=":")
    ax.set_xscale("log")
    _log_axis(ax.xaxis, "")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("speedup threshold p")
    ax.set_ylabel("fast_p (fraction of tasks)")
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper right")
    else:
        ax.text(0.5, 0.5, "no speedup measured", transform=ax.transAxes, ha="center", color="#777777")
    return _plot(fig, "fast_p", "fast_p curve",
                 "Fraction of all tasks that are correct and more than p times faster than the baseline"
                 " (solid: eager, dashed: torch.compile, when measured); fast_1 and fast_2 are read at the"
                 " dotted lines.")


def sol_plot(series: list[Series]) -> Plot | None:
    """Fraction of the reference algorithm's work bound per correct task, ranked; None when no run measured it."""
    ranked = [(s, sorted((r.sol_fraction for r in primary_results(s.run.results)
                          if r.correctness and r.sol_fraction is not None), reverse=True)) for s in series]
    if not any(values for _, values in ranked):
        return None
    fig = _figure(6.5, 3.2)
    ax = fig.subplots()
    for s, values in ranked:
        if values:
            ax.plot(range(1, len(values) + 1), values, "o-", color=s.color, markersize=3, linewidth=1.2,
                    label=_short(s.label))
    from matplotlib.ticker import MaxNLocator  # lazy: only the plots need matplotlib

    ax.axhline(1.0, color="#555555", linewidth=0.8, linestyle=":")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(1.1, max(v for _, values in ranked for v in values) * 1.05))
    ax.set_xlabel("tasks, ranked")
    ax.set_ylabel("fraction of the work bound")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _plot(fig, "sol", "Work bound",
                 "Each correct task's best time as a fraction of the reference algorithm's work bound:"
                 " max(FLOPs / peak, minimum bytes / bandwidth) of the reference at the hardware's peaks (the"
                 " larger of datasheet and measured). An honest kernel doing the reference's work stays under"
                 " 1; a task's stated structure may need less work than its reference.")


def cost_plot(series: list[Series]) -> Plot:
    """Dollars (or model calls, when every reply was free) and GPU seconds per task."""
    task_ids = list(dict.fromkeys(r.task_id for s in series for r in primary_results(s.run.results)))
    paid = any(r.cost_usd for s in series for r in s.run.results)
    money = ("cost_usd", "dollars") if paid else ("llm_calls", "model calls (replies cost nothing)")
    fig = _figure(9.0, 3.2 if len(task_ids) <= _BAR_LIMIT else 3.0)
    axes = fig.subplots(1, 2)
    for ax, (field, label) in zip(axes, (money, ("gpu_s", "GPU seconds"))):
        _per_task(ax, series, task_ids, field)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    return _plot(fig, "cost", "Cost per task",
                 ("Dollars" if paid else "Model calls") + " and GPU seconds (evaluation and profiling) per task.")


def _per_task(ax: Any, series: list[Series], task_ids: list[str], field: str) -> None:
    values = {s.label: {r.task_id: getattr(r, field) for r in primary_results(s.run.results)} for s in series}
    if len(task_ids) <= _BAR_LIMIT:
        width = 0.8 / max(1, len(series))
        for i, s in enumerate(series):
            xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(task_ids))]
            ax.bar(xs, [values[s.label].get(t) or 0 for t in task_ids], width=width, color=s.color, label=_short(s.label))
        ax.set_xticks(range(len(task_ids)), [_short(t, 18) for t in task_ids], rotation=60, ha="right", fontsize=7)
        return
    for s in series:
        ranked = sorted((v or 0 for v in values[s.label].values()), reverse=True)
        ax.plot(range(1, len(ranked) + 1), ranked, color=s.color, label=_short(s.label))
    ax.set_xlabel("tasks, ranked by this value")


def trajectory_plots(series: list[Series]) -> list[Plot]:
    """One small figure per task that has agent steps, every run that has it overlaid."""
    task_ids = list(dict.fromkeys(r.task_id for s in series for r in s.run.results if r.trajectory))
    plots = []
    for number, task_id in enumerate(task_ids):
        lines = [(s, r) for s in series for r in s.run.results if r.task_id == task_id and r.trajectory]
        plots.append(_trajectory(task_id, lines, number))
    return plots


def _trajectory(task_id: str, lines: list[tuple[Series, BenchTaskResult]], number: int) -> Plot:
    from matplotlib.ticker import MaxNLocator  # lazy: only the plots need matplotlib

    fig = _figure(5.2, 2.6)
    ax = fig.subplots()
    speeds = [p.speedup_vs_eager for _, r in lines for p in r.trajectory if p.speedup_vs_eager]
    floor = min(speeds + [1.0]) / 1.6  # failed steps sit on a band below every measured point
    for s, result in lines:
        points = result.trajectory
        best = [(p.index, p.best_speedup_vs_eager) for p in points if p.best_speedup_vs_eager]
        if best:
            ax.step([i for i, _ in best] + [points[-1].index], [b for _, b in best] + [best[-1][1]], where="post",
                    color=s.color, linewidth=1.2, alpha=0.7)
        for stage, (marker, _) in _STAGE_MARKERS.items():
            ok = [p for p in points if p.stage == stage and p.speedup_vs_eager]
            bad = [p for p in points if p.stage == stage and not p.speedup_vs_eager]
            ax.scatter([p.index for p in ok], [p.speedup_vs_eager for p in ok], marker=marker, color=s.color, s=30)
            ax.scatter([p.index for p in bad], [floor] * len(bad), marker=marker, facecolors="none",
                       edgecolors=s.color, s=30)
        profiled = [p for p in points if p.profile_shown]
        ax.scatter([p.index for p in profiled], [(p.speedup_vs_eager or floor) * 1.25 for p in profiled], marker="*",
                   color="#e6a100", s=40, zorder=3)
    ax.axhline(1.0, color="#555555", linewidth=0.8, linestyle=":")
    ax.axhspan(floor / 1.25, floor * 1.25, color="#f3d6d6", alpha=0.6, zorder=0)
    ax.set_yscale("log")
    _log_axis(ax.yaxis)
    ax.set_xlabel("step")
    ax.set_ylabel("speedup vs eager")
    ax.set_title(task_id, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    last = max(p.index for _, r in lines for p in r.trajectory)
    ax.set_xlim(-0.5, max(1, last) + 0.5)
    ax.margins(y=0.15)
    return _plot(fig, f"trajectory-{number}", f"Trajectory of {task_id}",
                 "; ".join(f"{s.label}: {r.steps} step(s), {r.stage_reached}" for s, r in lines))


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def task_outcome(result: BenchTaskResult | None) -> str:
    """One run's result for a task in a cell: "correct, 1.42x (1.1x compile)", the stage and failure
    that stopped it, or "-" when the run did not have the task."""
    if result is None:
        return "-"
    if not result.correctness:
        return result.stage_reached + (f": {result.failure}" if result.failure else "")
    compiled = f" ({_fmt_x(result.speedup_vs_compile)} compile)" if result.speedup_vs_compile is not None else ""
    return f"correct, {_fmt_x(result.speedup_vs_eager)}{compiled}"


def summary_rows(summary: GroupSummary) -> dict[str, str]:
    """A group's metrics as display strings (the Markdown and HTML tables share these)."""
    return {"tasks": str(summary.tasks), "compiled": str(summary.compiled), "correct": str(summary.correct),
            "fast_0": _fmt_pct(summary.fast_0), "fast_1": _fmt_pct(summary.fast_1_eager),
            "fast_2": _fmt_pct(summary.fast_2_eager), "fast_1_c": _fmt_pct(summary.fast_1_compile),
            "fast_2_c": _fmt_pct(summary.fast_2_compile), "geo": _fmt_x(summary.geomean_speedup_eager),
            "mean": _fmt_x(summary.mean_speedup_eager), "geo_c": _fmt_x(summary.geomean_speedup_compile),
            "mean_c": _fmt_x(summary.mean_speedup_compile), "sol": _fmt_pct(summary.median_sol_fraction),
            "cost": _fmt_usd(summary.cost_usd), "gpu": f"{summary.gpu_s:.0f}", "calls": str(summary.llm_calls)}


# ------------------------------------------------------------------------------ an agent run's outputs


def write_outputs(journal: Journal, results: list) -> None:
    """best/<task>.py (a drop-in ModelNew per task), summary.json and report.md."""
    setup = load_run(journal)
    for result in results:
        if result.best_sha256:
            best = journal.run_dir / "best" / f"{task_file_name(result.task_id)}.py"
            best.parent.mkdir(exist_ok=True)
            best.write_text(journal.read_text(f"candidates/{result.best_sha256}.py"), encoding="utf-8")
    totals = journal.totals()
    summary = {"run_id": setup.run_id, "model": setup.model, "totals": totals, "tasks": to_json(results)}
    (journal.run_dir / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    replies = [r["reply"] for r in journal.of_kind("reply") if r.get("reply")]
    steps = {t.task_id: journal.steps(t.task_id) for t in setup.tasks}
    min_gain = setup.agent.get("min_gain", AgentConfig.min_gain)
    report = render_template(
        "run_report.md.j2", setup=setup, results=results, totals=totals, steps=steps,
        recorded=any(r.get("recorded") for r in replies), exits=journal.of_kind("exit"),
        trees={task_id: tree_lines(trajectory(task_steps, min_gain)) for task_id, task_steps in steps.items()},
    )
    (journal.run_dir / "report.md").write_text(report, encoding="utf-8")
