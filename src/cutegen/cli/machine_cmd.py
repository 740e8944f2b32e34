"""`cutegen machine`: what this machine is (GPU, driver, CUDA, nvcc, torch, CUTLASS) and, on a CUDA
device, the peaks every speed-of-light figure is computed from."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cutegen.cli import app, env
from cutegen.evaluate import sol
from cutegen.evaluate.worker import WorkerPool
from cutegen.manifest import machine_manifest
from cutegen.records import to_json

MACHINE_HELP = (
    "Print this machine's manifest (the one every result file carries) and, with a CUDA device, its peaks:"
    " memory bandwidth and half-precision TFLOP/s measured in a fresh worker (cached per device and torch"
    " version; --fresh measures again), the datasheet's, and the hardware peaks the reference algorithm's"
    " work bound uses (the larger of the two)."
)
PEAK_FIELDS = ("bandwidth_gb_s", "fp32_tflops", "tf32_tflops", "half_tflops")


@app.command("machine", help=MACHINE_HELP)
def machine_command(
    peaks: bool = typer.Option(True, "--peaks/--no-peaks", help="Measure (or read the cached) device peaks."),
    fresh: bool = typer.Option(False, "--fresh", help="Measure the peaks again instead of reading the cache."),
    gpu: int = typer.Option(0, "--gpu", help="GPU index to measure."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    manifest = machine_manifest(env.runtime_config())
    found = _peaks(gpu, fresh) if peaks and manifest.get("gpu_count") else None
    if as_json:
        typer.echo(json.dumps({"manifest": manifest, "peaks": found}, indent=1))
    else:
        _print(manifest, found)
    sys.exit(0)


def _peaks(gpu: int, fresh: bool) -> dict[str, Any]:
    """The device's measured (or cached) peaks beside the datasheet's and the work bound's."""
    cache = env.cache_root() / "eval"
    with WorkerPool("cuda", (gpu,), warm_profiler=False) as pool:
        info = pool.info()
        if fresh:
            sol.peaks_path(cache, info["device_name"], info["torch_version"]).unlink(missing_ok=True)
        measured = sol.get_peaks(cache, pool, run_timeout_s=300.0)
    sheet = sol.datasheet_peaks(info["device_name"])
    return {"device_name": info["device_name"], "torch_version": info["torch_version"],
            "measured": to_json(measured) if measured else None, "datasheet": to_json(sheet) if sheet else None,
            "work_bound": to_json(sol.physical_peaks(measured)) if measured else None}


def _print(manifest: dict[str, Any], found: dict[str, Any] | None) -> None:
    console = Console()
    table = Table(title="machine", show_header=False)
    for key, value in manifest.items():
        table.add_row(key, "-" if value is None else str(value))
    console.print(table)
    if found is None:
        console.print("peaks: none (no CUDA device, or --no-peaks)")
        return
    peaks = Table(title=f"peaks of {found['device_name']}")
    for column in ("", "measured", "datasheet", "work bound"):
        peaks.add_column(column, justify="left" if not column else "right")
    for name in PEAK_FIELDS:
        cells = [(found[k] or {}).get(name) for k in ("measured", "datasheet", "work_bound")]
        peaks.add_row(name, *("-" if v is None else f"{v:.1f}" for v in cells))
    which = ", ".join((found["measured"] or {}).get("measured") or ()) or "none"
    peaks.caption = f"measured on this device: {which}; the rest from the datasheet"
    console.print(peaks)
