"""`cutegen bench --evaluate` and `cutegen export` on the GPU.

    python3 bench/bench_evaluate_h200.py --out DIR [--sections evaluate,kernelbench,torch_op]
        [--budget-s 280] [--kernelbench-tasks swish_scale] [--torch-op-tasks linear_gelu] [--work DIR]

Sections (results are written after each; a section that fails keeps the others):
- evaluate: `cutegen bench examples/tasks --evaluate tests/fixtures/bench_candidates` through the real
  CLI (a subprocess, CUDA, backend cute, the full protocol with both baselines): 13 candidate files,
  6 honest CuTe kernels and 7 broken ones (compile error, wrong results, a cheating op call, an
  illegal address, a launch error). Each file's first line says the verdict it must get; the table
  compares, and the suite summary (fast_p, means, per group) is copied from results.json. If the CLI
  runs out of time, the verdicts it finished (verdicts.jsonl) are judged and the section says partial.
  Expect about 2-4 minutes (torch.compile baselines for 6 tasks; the builds run in parallel first).
- kernelbench: `cutegen export RUN swish_scale --format kernelbench`, then in a fresh process the file
  is loaded as KernelBench loads it (exec the source, take ModelNew; its CuTe kernel builds with
  torch's load_inline) and compared with the reference on CUDA. About a minute per task (load_inline
  compiles the PyTorch headers).
- torch_op: `cutegen export RUN linear_gelu --format torch-op` (a task with weights); in a fresh
  process ModelOp is called eagerly and through torch.compile(fullgraph=True) (inductor), compared
  with the reference, and torch._dynamo.explain counts graphs and graph breaks. Under a minute.
Everything finishes within --budget-s (default 280 s: each step gets what is left, less what the later
sections need; a section without enough time left is skipped and says so). The run directory lives in
--work, so the sections can also be run by separate commands on the same machine. --device cpu is a
plumbing dry run with the torch-backend fixtures (not the check). Writes DIR/bench-evaluate-h200.json
and .md with the machine manifest, DIR/export/ (the exported files) and DIR/evaluate-run/ (the run's
results.json, and its report when matplotlib is there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

from _common import run_section  # noqa: E402 - bench/, this script's folder, is first on sys.path

TASKS = REPO / "examples" / "tasks"
CANDIDATES = REPO / "tests" / "fixtures" / "bench_candidates"
SIX_TASKS = ("conv2d", "layer_norm", "linear_gelu", "matmul", "row_softmax", "swish_scale")  # the folder's tasks
DRY_RUN_CANDIDATES = REPO / "tests" / "fixtures" / "honest"  # torch-backend files: --device cpu plumbing check
SECTIONS = ("evaluate", "kernelbench", "torch_op")
RUN_ID = "h200-evaluate"


def environment(work: Path) -> dict[str, str]:
    """The CLI's environment: cutegen from this checkout, caches in the work folder, and the CUTLASS
    headers the runtime uses also given to exported files (their load_inline build looks there)."""
    from cutegen.cli import env as cli_env
    from cutegen.runtime import find_cutlass_include

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["CUTEGEN_CACHE"] = os.environ.get("CUTEGEN_BENCH_CACHE") or str(work / "cache")  # h200_all.sh shares one
    env["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "160"
    try:
        env["CUTEGEN_CUTLASS_INCLUDE"] = str(find_cutlass_include(cli_env.runtime_config()))
    except Exception:  # noqa: BLE001 - the evaluation will say what is missing
        pass
    return env


def run(command: list[str], work: Path, timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=work, env=environment(work), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
        code, out = done.returncode, done.stdout
    except subprocess.TimeoutExpired as err:
        partial = err.stdout or ""
        code, out = "timeout", partial.decode(errors="replace") if isinstance(partial, bytes) else partial
    return {"command": " ".join(command[2:] if command[:2] == [sys.executable, "-m"] else command), "exit": code,
            "wall_s": round(time.perf_counter() - started, 1), "output_tail": out[-6000:]}


def cutegen(args: list[str], work: Path, timeout_s: float) -> dict[str, Any]:
    return run([sys.executable, "-m", "cutegen", *args], work, timeout_s)


def expectation(path: Path) -> tuple[str, set[str]]:
    """("pass", {}) or (stage, {acceptable failure names}) from the file's `# expect:` first line (a
    file without one, such as the dry run's honest torch candidates, must pass)."""
    match = re.match(r"#\s*expect:\s*(\S+)(?:\s+(\S+))?", path.read_text().splitlines()[0])
    if match is None:
        return "pass", set()
    return match.group(1), set((match.group(2) or "").split("|")) - {""}


def section_evaluate(ctx: dict[str, Any]) -> dict[str, Any]:
    from cutegen.bench import find_candidates
    from cutegen.tasks import load_tasks

    work, cuda = ctx["work"], ctx["device"] == "cuda"
    folder = CANDIDATES if cuda else DRY_RUN_CANDIDATES
    tasks = ",".join(ctx["evaluate_tasks"])
    step = cutegen(["bench", str(TASKS), "--select", tasks, "--evaluate", str(folder),
                    "--backend", "cute" if cuda else "torch",
                    "--device", ctx["device"], "--runs-dir", str(work / "runs"), "--run-id", RUN_ID, "--no-report",
                    *([] if cuda else ["--timing-trials", "5", "--correctness-trials", "1", "--no-compile-baseline"])],
                   work, remaining(ctx, reserve_s=ctx["export_reserve_s"]))
    results_path = work / "runs" / RUN_ID / "results.json"
    found, _ = find_candidates(load_tasks(TASKS, tasks), folder)
    if not results_path.is_file():  # cut short: judge what verdicts.jsonl holds
        by_key = partial_results(work / "runs" / RUN_ID / "verdicts.jsonl")
        rows = [judge(path, by_key.get(key)) for key, path in sorted(found.items(), key=lambda kv: kv[1].name)]
        return {"cli": step, "partial": True, "rows": rows, "ok": sum(r["status"] == "OK" for r in rows),
                "total": len(rows), "summary": {}, "error": "the CLI did not finish in its time (partial verdicts)"}
    data = json.loads(results_path.read_text())
    by_key = {(r["task_id"], r["sample_id"]): r for r in data["results"]}
    rows = [judge(path, by_key.get(key)) for key, path in sorted(found.items(), key=lambda kv: kv[1].name)]
    summary = {g["group"]: {k: g[k] for k in ("tasks", "compiled", "correct", "fast_0", "fast_1_eager", "fast_2_eager",
                                             "fast_1_compile", "fast_2_compile", "geomean_speedup_eager",
                                             "mean_speedup_eager", "geomean_speedup_compile", "median_sol_fraction",
                                             "gpu_s")}
               for g in data["summary"]}
    report = write_bench_report(work / "runs" / RUN_ID, ctx["out"])
    return {"cli": step, "rows": rows, "ok": sum(r["status"] == "OK" for r in rows), "total": len(rows),
            "summary": summary, "manifest_in_results": data.get("manifest"), "tolerance": data.get("tolerance"),
            "report": report}


def partial_results(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Finished verdicts of an --evaluate run that was cut short, in results.json's field names."""
    found = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)
        verdict = record.get("verdict") or {}
        found[(record["task_id"], record["sample_id"])] = {
            "correctness": bool(verdict.get("passed")), "stage_reached": "passed" if verdict.get("passed")
            else verdict.get("stage", "task_error"), "failure": verdict.get("failure") or record.get("task_error"),
            "speedup_vs_eager": verdict.get("speedup_vs_eager"), "speedup_vs_compile": verdict.get("speedup_vs_compile"),
            "sol_fraction": verdict.get("sol_fraction"), "median_ms": (verdict.get("timing") or {}).get("median_ms")}
    return found


def remaining(ctx: dict[str, Any], reserve_s: float = 0.0, floor_s: float = 30.0) -> float:
    """Seconds this step may still take: what is left of --budget-s, less what later sections need."""
    return max(floor_s, ctx["deadline"] - time.monotonic() - reserve_s)


def judge(path: Path, result: dict | None) -> dict[str, Any]:
    stage, failures = expectation(path)
    row = {"file": path.name, "expected": stage + (f" ({'|'.join(sorted(failures))})" if failures else "")}
    if result is None:
        return {**row, "status": "NOT-OK", "got": "no result"}
    got = "pass" if result["correctness"] else result["stage_reached"]
    row.update(got=got, failure=result["failure"], speedup_vs_eager=result["speedup_vs_eager"],
               speedup_vs_compile=result["speedup_vs_compile"], sol_fraction=result["sol_fraction"],
               median_ms=result["median_ms"])
    ok = got == stage and (not failures or result["failure"] in failures)
    return {**row, "status": "OK" if ok else "NOT-OK"}


def write_bench_report(run_dir: Path, out: Path) -> str:
    """The HTML/Markdown report of the run into DIR/report (needs matplotlib, which the GPU machine
    may lack: then only results.json is copied)."""
    target = out / "evaluate-run"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("results.json", "bench.json"):
        if (run_dir / name).is_file():
            (target / name).write_text((run_dir / name).read_text())
    try:
        from cutegen import bench, report

        report.write_report([bench.load_run(run_dir)], target)
        return "written"
    except ImportError as err:
        return f"skipped ({err}); run `cutegen report` on results.json elsewhere"


KERNELBENCH_CHECK = textwrap.dedent("""
    import json, sys, time, torch
    path, task_path, device = sys.argv[1], sys.argv[2], sys.argv[3]
    ref_ns = {}
    exec(compile(open(task_path).read(), task_path, "exec"), ref_ns)
    source = open(path).read()
    started = time.perf_counter()
    context = {}
    exec(compile(source, path, "exec"), context)   # KernelBench-style loading: exec, then take ModelNew
    ModelNew = context["ModelNew"]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    ref = ref_ns["Model"](*ref_ns["get_init_inputs"]()).to(device)
    torch.manual_seed(0)
    new = ModelNew(*ref_ns["get_init_inputs"]()).to(device)
    errors, close = [], []
    with torch.no_grad():
        for seed in range(3):
            torch.manual_seed(100 + seed)
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ref_ns["get_inputs"]()]
            out, want = new(*inputs), ref(*inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            if seed == 0:
                first_call_s = time.perf_counter() - started
            errors.append(float((out - want).abs().max()))
            close.append(bool(torch.allclose(out, want, atol=1e-4, rtol=1e-4)))
    print("RESULT " + json.dumps({"max_abs_error": max(errors), "first_call_s": first_call_s,
                                  "standalone": "from cutegen" not in source and "import cutegen" not in source,
                                  "uses_load_inline": "load_inline(" in source, "close": all(close)}))
""")


def section_kernelbench(ctx: dict[str, Any]) -> dict[str, Any]:
    work = ctx["work"]
    ensure_run(ctx)
    rows = []
    for task in ctx["kernelbench_tasks"]:
        if remaining(ctx, floor_s=0.0) < 75:  # a load_inline build alone takes about a minute
            rows.append({"task": task, "error": "skipped: not enough of --budget-s left"})
            continue
        target = work / "export" / f"{task}.py"
        target.parent.mkdir(exist_ok=True)
        step = cutegen(["export", str(work / "runs" / RUN_ID), task, "--format", "kernelbench", "--out", str(target),
                        "--force"], work, 60)
        check = run([sys.executable, "-c", KERNELBENCH_CHECK, str(target), str(TASKS / f"{task}.py"), ctx["device"]],
                    work, remaining(ctx, reserve_s=ctx["torch_op_reserve_s"]))
        rows.append({"task": task, "export": step, "check": check, **parse_result(check)})
        if target.is_file():
            (ctx["out"] / "export").mkdir(parents=True, exist_ok=True)
            (ctx["out"] / "export" / target.name).write_text(target.read_text())
    needs_build = ctx["device"] == "cuda"  # the CuTe kernels: standalone and built by load_inline
    ok = sum(bool(r.get("close") and r.get("standalone") and (r.get("uses_load_inline") or not needs_build))
             for r in rows)
    return {"rows": rows, "ok": ok, "total": len(rows)}


TORCH_OP_CHECK = textwrap.dedent("""
    import importlib.util, json, sys, time, torch
    path, task_path, device = sys.argv[1], sys.argv[2], sys.argv[3]
    ref_ns = {}
    exec(compile(open(task_path).read(), task_path, "exec"), ref_ns)
    spec = importlib.util.spec_from_file_location("exported_op", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    ref = ref_ns["Model"](*ref_ns["get_init_inputs"]()).to(device)
    torch.manual_seed(0)
    op = module.ModelOp(*ref_ns["get_init_inputs"]()).to(device)
    inputs = [x.to(device) for x in ref_ns["get_inputs"]()]
    result = {}
    with torch.no_grad():
        want = ref(*inputs)
        result["eager_max_abs_error"] = float((op(*inputs) - want).abs().max())
        try:
            explain = torch._dynamo.explain(op)(*inputs)
            result["graphs"], result["graph_breaks"] = explain.graph_count, explain.graph_break_count
            result["op_in_graph"] = any("cutegen." in str(n.target) for g in explain.graphs for n in g.graph.nodes)
        except Exception as err:
            result["explain_error"] = f"{type(err).__name__}: {err}"[:500]
        torch._dynamo.reset()
        started = time.perf_counter()
        compiled = torch.compile(op, fullgraph=True)
        got = compiled(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        result["compile_first_call_s"] = time.perf_counter() - started
        result["compiled_max_abs_error"] = float((got - want).abs().max())
        torch.manual_seed(7)
        other = [x.to(device) for x in ref_ns["get_inputs"]()]
        result["compiled_fresh_inputs_max_abs_error"] = float((compiled(*other) - ref(*other)).abs().max())
    result["close"] = max(result["eager_max_abs_error"], result["compiled_max_abs_error"],
                          result["compiled_fresh_inputs_max_abs_error"]) <= 1e-3
    print("RESULT " + json.dumps(result))
""")


def section_torch_op(ctx: dict[str, Any]) -> dict[str, Any]:
    work = ctx["work"]
    ensure_run(ctx)
    rows = []
    for task in ctx["torch_op_tasks"]:
        if remaining(ctx, floor_s=0.0) < 20:
            rows.append({"task": task, "error": "skipped: not enough of --budget-s left"})
            continue
        target = work / "export" / f"{task}_op.py"
        target.parent.mkdir(exist_ok=True)
        step = cutegen(["export", str(work / "runs" / RUN_ID), task, "--format", "torch-op", "--out", str(target),
                        "--force"], work, 60)
        check = run([sys.executable, "-c", TORCH_OP_CHECK, str(target), str(TASKS / f"{task}.py"), ctx["device"]],
                    work, remaining(ctx))
        rows.append({"task": task, "export": step, "check": check, **parse_result(check)})
        if target.is_file():
            (ctx["out"] / "export").mkdir(parents=True, exist_ok=True)
            (ctx["out"] / "export" / target.name).write_text(target.read_text())
    ok = sum(bool(r.get("close") and r.get("graphs") == 1 and r.get("graph_breaks") == 0) for r in rows)
    return {"rows": rows, "ok": ok, "total": len(rows)}


def parse_result(step: dict[str, Any]) -> dict[str, Any]:
    found = re.findall(r"^RESULT (.*)$", step["output_tail"], flags=re.M)
    return json.loads(found[-1]) if found else {"error": "no RESULT line"}


def ensure_run(ctx: dict[str, Any]) -> None:
    """The exports need the evaluate run: run it here unless this process already tried."""
    if (ctx["work"] / "runs" / RUN_ID / "results.json").is_file():
        return
    if "evaluate" in ctx["results"]["sections"]:
        raise RuntimeError("the evaluate section did not finish, so there is no run to export from")
    ctx["results"]["sections"]["evaluate"] = section_evaluate(ctx)


def write_report(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-evaluate-h200.json").write_text(json.dumps(results, indent=1, default=str))
    m = results["manifest"]
    dry = results.get("device") == "cpu"
    lines = ["# cutegen bench --evaluate and export " + ("(dry run on CPU: plumbing only, not the GPU check)"
                                                        if dry else "on the GPU"), "",
             f"{m.get('gpu_name') or 'no GPU'}, driver {m.get('driver_version')}, CUDA {m.get('cuda_runtime')}, torch"
             f" {m.get('torch_version')}, CUTLASS {m.get('cutlass_version')}, nvcc {m.get('nvcc_version')},"
             f" {m.get('timestamp_utc')}.", ""]
    for name, data in results["sections"].items():
        lines += [f"## {name} ({data.get('wall_s', 0):.0f} s): {data.get('ok', '-')}/{data.get('total', '-')} OK", ""]
        if "error" in data:
            lines += ["```", str(data["error"])[-3000:], "```", ""]
        lines += section_lines(name, data)
    (out / "bench-evaluate-h200.md").write_text("\n".join(lines) + "\n")


def section_lines(name: str, data: dict[str, Any]) -> list[str]:
    def fmt(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, float) else "-" if value is None else str(value)

    lines = []
    if name == "evaluate" and "rows" in data:
        lines += ["| file | expected | got | failure | vs eager | vs compile | SOL | status |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['file']} | {r['expected']} | {r.get('got')} | {r.get('failure') or '-'} |"
                  f" {fmt(r.get('speedup_vs_eager'))} | {fmt(r.get('speedup_vs_compile'))} |"
                  f" {fmt(r.get('sol_fraction'))} | {r['status']} |" for r in data["rows"]]
        lines += ["", "| group | tasks | correct | fast_0 | fast_1 | fast_2 | geomean | fast_1 (compile) |"
                  " geomean (compile) | median SOL |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {g} | {s['tasks']} | {s['correct']} | {fmt(s['fast_0'])} | {fmt(s['fast_1_eager'])} |"
                  f" {fmt(s['fast_2_eager'])} | {fmt(s['geomean_speedup_eager'])} | {fmt(s['fast_1_compile'])} |"
                  f" {fmt(s['geomean_speedup_compile'])} | {fmt(s['median_sol_fraction'])} |"
                  for g, s in data["summary"].items()]
        lines += ["", f"CLI: `{data['cli']['command']}` exit {data['cli']['exit']} in {data['cli']['wall_s']} s;"
                  f" report: {data.get('report')}.", ""]
    elif "rows" in data:
        keys = sorted({k for r in data["rows"] for k in r if k not in ("export", "check", "task")})
        lines += ["| task | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        lines += ["| " + r["task"] + " | " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in data["rows"]]
        for r in data["rows"]:
            if r.get("error") or not r.get("close"):
                tail = (r.get("check") or {}).get("output_tail", "")
                lines += ["", f"{r['task']}: {r.get('error') or 'not close'}", "```", tail[-2500:], "```"]
        lines.append("")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "cutegen-bench-evaluate-h200")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a plumbing dry run with the torch-backend fixtures (no GPU; not the check)")
    parser.add_argument("--budget-s", type=float, default=280.0,
                        help="finish within this many seconds (each step's time limit is what is left)")
    parser.add_argument("--kernelbench-tasks", default="swish_scale", help="tasks exported as KernelBench files"
                        " (each load_inline build takes about a minute), e.g. swish_scale,linear_gelu")
    parser.add_argument("--torch-op-tasks", default="linear_gelu", help="tasks exported as torch ops")
    parser.add_argument("--evaluate-tasks", default=",".join(SIX_TASKS),
                        help="the tasks whose candidate files the evaluate section judges (default: all six); the"
                        " export sections need theirs among them")
    args = parser.parse_args()
    from cutegen.cli import env as cli_env
    from cutegen.manifest import machine_manifest

    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"manifest": machine_manifest(cli_env.runtime_config()), "sections": {}}
    kernelbench = [t for t in args.kernelbench_tasks.split(",") if t]
    torch_op = [t for t in args.torch_op_tasks.split(",") if t]
    evaluate_tasks = [t for t in args.evaluate_tasks.split(",") if t]
    if not set(kernelbench + torch_op) <= set(evaluate_tasks):
        parser.error("--kernelbench-tasks and --torch-op-tasks must be among --evaluate-tasks: they export from"
                     " that run")
    ctx = {"work": args.work, "out": args.out, "results": results, "device": args.device,
           "deadline": time.monotonic() + args.budget_s, "kernelbench_tasks": kernelbench, "torch_op_tasks": torch_op,
           "evaluate_tasks": evaluate_tasks,
           "torch_op_reserve_s": 40.0 * len(torch_op), "export_reserve_s": 90.0 * len(kernelbench) + 40.0 * len(torch_op)}
    results["device"] = args.device
    for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
        data = run_section(name, globals(), ctx, results, lambda r: write_report(args.out, r))
        print(f"{name}: {data.get('ok', '-')}/{data.get('total', '-')} OK in {data['wall_s']:.0f} s", flush=True)
    return 0 if all("error" not in d and d.get("ok") == d.get("total") for d in results["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
