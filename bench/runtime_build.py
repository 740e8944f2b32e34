"""Build the example candidate through cutegen.runtime on a GPU machine, check it, time the build.

    python3 bench/runtime_build.py --out DIR

With a fresh, empty build cache:
1. cold build: every CuteKernel of examples/candidates/swish_scale_cute.py is compiled (wall seconds;
   the CUDA context is created first so its cost is not counted as build time);
2. cached load: a fresh Python process loads the same kernels from the cache (time from the build
   call to loaded, callable launchers), once after creating the CUDA context and once with the
   context creation inside the measured call (as a first use in a new process would see it);
3. correctness: ModelNew against the task's Model on random inputs of several sizes, odd ones,
   a misaligned view and a side stream included; pass when max abs error <= 1e-5 everywhere;
4. an indicative kernel time against eager PyTorch (CUDA events, median; not the evaluator's protocol)
   and the host cost of one ModelNew.forward (allocation, argument checks, ctypes call, launch).
Writes DIR/runtime-h200.json and DIR/runtime-h200.md with the machine manifest. Exits 1 when a build
or a correctness check fails; the timing targets (cold <= 15 s, cached <= 0.5 s) are reported only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

CANDIDATE = REPO / "examples" / "candidates" / "swish_scale_cute.py"
TASK = REPO / "examples" / "tasks" / "swish_scale.py"
ATOL = 1e-5
TARGET_COLD_S = 15.0
TARGET_CACHED_S = 0.5

# Runs in a fresh interpreter: argv = cache_dir, candidate path, "warm" (CUDA context first) or "cold".
_CHILD = r"""
import importlib.util, json, sys, time
started = time.perf_counter()
cache_dir, candidate, mode = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
cuda_init_s = None
if mode == "warm":
    t = time.perf_counter(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    cuda_init_s = time.perf_counter() - t
from pathlib import Path
from cutegen.config import RuntimeConfig
from cutegen.runtime import find_kernels
spec = importlib.util.spec_from_file_location("candidate", candidate)
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
config = RuntimeConfig(cache_dir=Path(cache_dir))
t = time.perf_counter()
results = [kernel.build(config) for kernel in find_kernels(module)]
load_s = time.perf_counter() - t
t = time.perf_counter()
x = torch.randn(4097, device="cuda"); y = module.ModelNew(1.5)(x); torch.cuda.synchronize()
first_call_s = time.perf_counter() - t
ok = bool(torch.allclose(y, x * torch.sigmoid(x) * 1.5, atol=1e-5, rtol=0))
print(json.dumps({"mode": mode, "cached_load_s": load_s, "all_cached": all(r.cached for r in results),
                  "cuda_init_s": cuda_init_s, "first_call_s": first_call_s, "first_call_correct": ok,
                  "process_s": time.perf_counter() - started}))
"""


def _import(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cold_build(cache_dir: Path) -> dict[str, Any]:
    import torch

    from cutegen.config import RuntimeConfig
    from cutegen.runtime import find_kernels

    torch.zeros(1, device="cuda")  # CUDA context first: its cost is not the build's
    torch.cuda.synchronize()
    module = _import(CANDIDATE, "candidate")
    config = RuntimeConfig(cache_dir=cache_dir)
    kernels = []
    started = time.perf_counter()
    for kernel in find_kernels(module):
        t = time.perf_counter()
        result = kernel.build(config)
        kernels.append({
            "name": kernel.name, "wall_s": round(time.perf_counter() - t, 3),
            "compile_s": None if result.compile_s is None else round(result.compile_s, 3),
            "cached": result.cached, "arch": result.arch, "nvcc_version": result.nvcc_version,
            "library_bytes": result.library_path.stat().st_size,
        })
    return {"wall_s": round(time.perf_counter() - started, 3), "kernels": kernels, "module": module}


def cached_load(cache_dir: Path, mode: str) -> dict[str, Any]:
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(cache_dir), str(CANDIDATE), mode],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "PYTHONPATH": path},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cached-load subprocess ({mode}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cases(torch: Any) -> list[tuple[str, Any]]:
    g = torch.Generator(device="cuda").manual_seed(1234)

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return torch.randn(*shape, device="cuda", generator=g) * scale

    return [
        ("task shape (256, 4096)", randn(256, 4096)),
        ("(1,)", randn(1)),
        ("(3,)", randn(3)),
        ("(4095,)", randn(4095)),
        ("(4096,) one tile", randn(4096)),
        ("(4097,) tile + 1", randn(4097)),
        ("(7, 13, 17) odd 3-D", randn(7, 13, 17)),
        ("(16, 1023)", randn(16, 1023)),
        ("(1000003,) prime", randn(1000003)),
        ("(4097,) x4 wider range", randn(4097, scale=4.0)),
        ("(33554432,) 128 MiB", randn(1 << 25)),
        ("misaligned view [1:] of (16391,)", randn(16391)[1:]),
    ]


def correctness(module: Any) -> list[dict[str, Any]]:
    import torch

    reference = _import(TASK, "task").Model(1.5).cuda()
    model = module.ModelNew(1.5)
    rows = []
    for label, x in _cases(torch):
        rows.append(_compare(label, model(x), reference(x), x))
    side = torch.cuda.Stream()  # the launcher must enqueue on the caller's current stream
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        y = model(x)
    side.synchronize()
    rows.append(_compare("(1048576,) on a side stream", y, reference(x), x))
    return rows


def _compare(label: str, y: Any, ref: Any, x: Any) -> dict[str, Any]:
    import torch

    torch.cuda.synchronize()
    same_meta = y.shape == ref.shape and y.dtype == ref.dtype
    diff = (y.double() - ref.double()).abs() if same_meta else None
    max_abs = float(diff.max()) if diff is not None and diff.numel() else 0.0
    exact = float((y == ref).float().mean()) if same_meta and y.numel() else 1.0
    return {
        "case": label, "numel": x.numel(), "aligned_16B": x.data_ptr() % 16 == 0,
        "max_abs_error": max_abs, "exact_fraction": round(exact, 6),
        "passed": bool(same_meta and max_abs <= ATOL and not torch.isnan(y).any().item()),
    }


def kernel_timing(module: Any) -> dict[str, Any]:
    """Median of 50 CUDA-event timings after 10 warm-ups; L2 is not flushed (indicative only)."""
    import torch

    reference, model = _import(TASK, "task").Model(1.5).cuda(), module.ModelNew(1.5)
    out: dict[str, Any] = {}
    for numel in (256 * 4096, 1 << 26):
        x = torch.randn(numel, device="cuda")
        for name, fn in (("cute", model), ("eager", reference)):
            for _ in range(10):
                fn(x)
            times = []
            for _ in range(50):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(x)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            median_ms = sorted(times)[len(times) // 2]
            out[f"{name}_{numel}_median_ms"] = round(median_ms, 4)
            out[f"{name}_{numel}_gb_per_s"] = round(2 * 4 * numel / (median_ms * 1e-3) / 1e9, 1)
    small = torch.randn(1024, device="cuda")
    out["forward_host_us"] = round(_host_us(lambda: model(small)), 2)  # allocation, checks, ctypes, launch
    out["launcher_host_us"] = round(_host_us(lambda: module.kernel.swish_scale(small, x, 1024, 1.5)), 2)
    return out


def _host_us(fn: Any, calls: int = 5000) -> float:
    """Host time per call (microseconds) of an asynchronous launch, averaged over many calls."""
    import torch

    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def write_markdown(path: Path, report: dict[str, Any]) -> None:
    cold, manifest = report.get("cold_build") or {}, report["manifest"]
    lines = [
        "# cutegen.runtime on the GPU machine",
        "",
        f"{manifest.get('gpu_name')} (sm {manifest.get('gpu_capability')}), driver {manifest.get('driver_version')},"
        f" CUDA {manifest.get('cuda_runtime')}, nvcc {manifest.get('nvcc_version')},"
        f" torch {manifest.get('torch_version')},"
        f" CUTLASS {manifest.get('cutlass_version')}, Python {manifest.get('python_version')},"
        f" {manifest.get('cpu_count')} CPUs, {manifest.get('timestamp_utc')}.",
        "",
        f"Result: **{'PASS' if report['passed'] else 'FAIL'}**",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| cold build, all kernels (wall s) | {cold.get('wall_s')} | <= {TARGET_COLD_S} |",
    ]
    for row in report.get("cached_load", []):
        label = "after CUDA init" if row["mode"] == "warm" else "incl. CUDA init"
        lines.append(f"| cached load, fresh process, {label} (s) | {row['cached_load_s']:.3f} | <= {TARGET_CACHED_S} |")
    lines += ["", "| case | numel | 16B-aligned | max abs error | exact fraction | pass |", "|---|---|---|---|---|---|"]
    for row in report.get("correctness", []):
        lines.append(
            f"| {row['case']} | {row['numel']} | {row['aligned_16B']} | {row['max_abs_error']:.3g}"
            f" | {row['exact_fraction']} | {'yes' if row['passed'] else 'NO'} |"
        )
    if report.get("timing"):
        lines += ["", "Indicative kernel times (median ms, no L2 flush): " + json.dumps(report["timing"])]
    if report["errors"]:
        lines += ["", "## Errors", ""] + [f"```\n{e}\n```" for e in report["errors"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run(keep_cache: bool) -> dict[str, Any]:
    from cutegen.manifest import machine_manifest

    report: dict[str, Any] = {"manifest": machine_manifest(), "errors": [], "passed": False, "atol": ATOL}
    cache_dir = Path(tempfile.mkdtemp(prefix="cutegen-bench-cache-"))
    report["cache_dir_was_empty"] = not any(cache_dir.iterdir())
    try:
        cold = cold_build(cache_dir)
        module = cold.pop("module")
        report["cold_build"] = cold
        report["cached_load"] = [cached_load(cache_dir, mode) for mode in ("warm", "cold")]
        report["correctness"] = correctness(module)
        try:
            report["timing"] = kernel_timing(module)
        except Exception:  # timing is informative; it must not hide the correctness result
            report["errors"].append("timing: " + traceback.format_exc())
        loads = report["cached_load"]
        built_ok = all(not k["cached"] for k in cold["kernels"]) and all(
            r["all_cached"] and r["first_call_correct"] for r in loads
        )
        report["passed"] = built_ok and all(r["passed"] for r in report["correctness"])
    except Exception:
        report["errors"].append(traceback.format_exc())
    finally:
        if not keep_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)
    cold_s = (report.get("cold_build") or {}).get("wall_s")
    cached_s = report["cached_load"][0]["cached_load_s"] if report.get("cached_load") else None
    report["targets"] = {
        "cold_build_s_met": cold_s is not None and cold_s <= TARGET_COLD_S,
        "cached_load_s_met": cached_s is not None and cached_s <= TARGET_CACHED_S,
    }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for runtime-h200.json and .md")
    parser.add_argument("--keep-cache", action="store_true", help="keep the temporary build cache")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        report = run(args.keep_cache)
    except Exception:  # e.g. cutegen not importable: still leave a record behind
        report = {"manifest": {}, "errors": [traceback.format_exc()], "passed": False}
    (args.out / "runtime-h200.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    write_markdown(args.out / "runtime-h200.md", report)
    print((args.out / "runtime-h200.md").read_text())
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
