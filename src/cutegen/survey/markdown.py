"""The survey file as a Markdown table: the summary per track and level, the probe's verdict and
flags, then one row per task."""

from __future__ import annotations

from typing import Any

from cutegen.survey.probe import task_order
from cutegen.survey.table import probe_current


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def markdown(state: dict[str, Any]) -> str:
    summary, m = state["summary"], state.get("manifest") or {}
    lines = ["# KernelBench baselines: eager and torch.compile, speed of light, degenerate tasks", "",
             f"{m.get('gpu_name') or 'no GPU'}, driver {m.get('driver_version')}, CUDA {m.get('cuda_runtime')},"
             f" torch {m.get('torch_version')}; {len(state.get('runs', []))} runs; {summary['tasks']} tasks,"
             f" {summary['tasks_left']} with something left to measure.", "",
             "| group | measured | errors | compiled | compile errors | eager SOL (median) | compile SOL (median)"
             " | compile speedup (geomean) | eager noise % (median) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, g in sorted(summary["groups"].items(), key=lambda kv: (" " in kv[0], kv[0])):
        lines.append(f"| {name} | {g['measured']} | {g['errors']} | {g['compiled']} | {g['compile_errors']} |"
                     f" {_ms(g['median_sol_fraction_eager'])} | {_ms(g['median_sol_fraction_compiled'])} |"
                     f" {_ms(g['geomean_compile_speedup'])} | {_ms(g['median_noise_pct'])} |")
    lines += probe_lines(summary)
    lines += ["", "| task | fp32 eager ms | fp32 compile ms | tf32 eager ms | tf32 compile ms | SOL fp32 ms | SOL tf32 ms"
              " | trivial @1e-4 | note |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [task_line(task_id, state["tasks"][task_id]) for task_id in sorted(state.get("tasks", {}), key=task_order)]
    return "\n".join(lines) + "\n"


def probe_lines(summary: dict[str, Any]) -> list[str]:
    """The probe's verdict and flags, and the tasks whose times pass a bound."""
    probe = summary["probe"]
    tracks = {name: g for name, g in summary["groups"].items() if " " not in name}
    beyond = [f"{t} ({name})" for name, g in tracks.items() for t in g["beyond_bound"]]
    beyond_hardware = [f"{t} ({name})" for name, g in tracks.items() for t in g["beyond_hardware_bound"]]
    closest = max((g["max_hardware_fraction"] or 0 for g in tracks.values()), default=0)
    stale = probe.get("stale", [])
    return ["", f"Trivial-solution probe: {probe['tasks_probed']} tasks probed, verdict **{probe['verdict']}**"
            f" (listed as constant and missed at 1e-4: {', '.join(probe['must_flag_missed']) or '-'};"
            f" not probed yet: {', '.join(probe['must_flag_not_probed_yet']) or '-'})."
            + (f" {len(stale)} tasks were probed by an earlier probe (the reference in eval mode, which the"
               " evaluator does not use, or no failed fractions): they are left out here and probed again."
               if stale else ""), "",
            f"- flagged at 1e-4: {', '.join(probe['flagged_1e-4']) or '-'}",
            f"- flagged at 1e-2: {', '.join(probe['flagged_1e-2']) or '-'}",
            "- nearly trivial at 1e-2 (a trivial answer fails at most one element in a thousand), not flagged:"
            f" {', '.join(probe['near_trivial_1e-2']) or '-'}",
            "- listed as nearly constant in EVALUATION.md: found (flagged or nearly trivial at 1e-4 or 1e-2)"
            f" {', '.join(probe['nearly_constant_found']) or '-'}; missed"
            f" {', '.join(probe['nearly_constant_missed']) or '-'}",
            f"- flagged but not listed in EVALUATION.md: {', '.join(probe['flagged_not_listed']) or '-'}",
            "- eager or torch.compile below the speed-of-light bound of the measured peaks:"
            f" {', '.join(beyond) or '-'}",
            f"- eager or torch.compile below the hardware's bound (measured or datasheet peaks, whichever is higher;"
            f" the evaluator rejects past it): {', '.join(beyond_hardware) or '-'} (the closest reaches"
            f" {closest:.3f} of it)"]


def task_line(task_id: str, entry: dict[str, Any]) -> str:
    tracks, probe = entry.get("tracks", {}), entry.get("probe") or {}
    cells, notes = [], []
    for track in ("fp32", "tf32"):
        row = tracks.get(track) or {}
        cells += [_ms((row.get("eager") or {}).get("median_ms")), _ms((row.get("compiled") or {}).get("median_ms"))]
        for key in ("error", "compile_error"):
            if row.get(key):
                notes.append(f"{track} {key.replace('_', ' ')}: {row[key].splitlines()[0][:80]}")
    cells += [_ms((tracks.get(t) or {}).get("sol_bound_ms")) for t in ("fp32", "tf32")]
    flags = ", ".join(probe.get("trivial@0.0001", [])) or ("probe error" if "error" in probe else "-")
    cells.append(flags if not probe or probe_current(probe) else f"{flags} (earlier probe)")
    note = "; ".join(notes).replace("|", "/")
    return f"| {task_id} {entry.get('name', '')} | " + " | ".join(cells) + f" | {note or '-'} |"
