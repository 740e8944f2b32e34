"""Run the agent workflow on a GPU with RECORDED replies holding real CuTe kernels, and check it.

    python3 bench/agent_replay_h200.py --out DIR [--backend cute|cuda] [--run-dir RUN] [--timing-trials N]
                                       [--cpu-dry-run]

The model is replaced by examples/replays/swish_scale_cute.jsonl (hand-written replies, labelled as
recorded everywhere): for examples/tasks/swish_scale.py it answers with
  1. a CuTe kernel that does not compile (`sigmoidf` is not a CUDA function)  -> build failure,
  2. its fix, correct but with uncoalesced accesses (16 consecutive elements per thread),
  3. a coalesced scalar kernel (optimization round 1),
  4. a vectorized kernel, 128-bit float4 accesses (optimization round 2).
With `--backend cuda` the replies are examples/replays/swish_scale_cuda.jsonl instead, the same
workflow in plain CUDA (no CuTe): a launch that does not compile (the most vexing parse of a dim3),
its fix, 128-bit vectors, then several vectors in flight per thread; judged under the cuda backend.
The agent runs with that backend, device cuda, precision track fp32, 2 rounds, 1 repair, profiling
delayed:1, through the real evaluator (nvcc builds, correctness, anti-cheat, timing against eager and
torch.compile). Then a second session resumes the finished run and must make no model call and no
evaluation. What this measures is the workflow and the evaluator on real kernels, not a model.

Writes DIR/agent_replay.json (checks, steps, verdict summaries, machine manifest), DIR/agent_replay.md
(the checks and the run's report.md) and DIR/journal.jsonl. Exits 1 when a check fails, 2 when the
machine cannot run it (no CUDA device); the outputs are written in every case. `--cpu-dry-run`
exercises this script without a GPU: the torch-backend replies (examples/replays/swish_scale_torch.jsonl)
on the CPU, same checks.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from _common import check_lines

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing cutegen
    sys.path.insert(0, str(REPO / "src"))

TASK = REPO / "examples" / "tasks" / "swish_scale.py"
REPLAYS = {"cute": REPO / "examples" / "replays" / "swish_scale_cute.jsonl",
           "cuda": REPO / "examples" / "replays" / "swish_scale_cuda.jsonl"}
# What the first reply's compile error must say, per backend.
FIRST_ERRORS = {"cute": "sigmoidf", "cuda": 'from "dim3 (unsigned int, unsigned int)" to "dim3"'}
DRY_RUN_REPLAY = REPO / "examples" / "replays" / "swish_scale_torch.jsonl"
EXPECTED_STAGES = ["generate", "repair_build", "optimize", "optimize"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--timing-trials", type=int, default=100)
    parser.add_argument("--backend", choices=sorted(REPLAYS), default="cute",
                        help="cute: the CuTe replies; cuda: the plain-CUDA ones")
    parser.add_argument("--cpu-dry-run", action="store_true", help="torch backend on the CPU (tests this script)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"bench": "agent_replay_h200", "replies": "recorded (hand-written), not a model",
                              "checks": [], "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    status = 1
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="cutegen-")) / "agent-replay"
    try:
        result["manifest"] = _manifest()
        status = _run(args, run_dir, result)
    except Exception as err:  # one shot on the GPU machine: keep whatever was learned
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()
    finally:
        _write(args.out, run_dir, result)
    return status


def _run(args: argparse.Namespace, run_dir: Path, result: dict[str, Any]) -> int:
    import torch

    if not torch.cuda.is_available() and not args.cpu_dry_run:
        result["error"] = "no CUDA device: this benchmark needs the GPU machine"
        return 2
    from cutegen.agent import Agent
    from cutegen.cli import env
    from cutegen.config import AgentConfig, EvalConfig, ProviderSettings
    from cutegen.journal import Journal, start_run, write_outputs
    from cutegen.llm import provider_from_spec
    from cutegen.tasks import load_task

    cache = run_dir.parent / "cache"
    runtime = dataclasses.replace(env.runtime_config(), cache_dir=cache / "build")  # cold builds: timed
    if args.cpu_dry_run:
        eval_config = EvalConfig(backend="torch", device="cpu", timing_trials=args.timing_trials,
                                 compile_baseline=False, cache_dir=cache / "eval", runtime=runtime)
    else:
        eval_config = EvalConfig(backend=args.backend, device="cuda", track="fp32", timing_trials=args.timing_trials,
                                 cache_dir=cache / "eval", runtime=runtime)
    result["evaluation"] = {"backend": eval_config.backend, "device": eval_config.device, "track": eval_config.track,
                            "timing_trials": eval_config.timing_trials}
    agent_config = AgentConfig(rounds=2, repairs=1, generations=1, patience=3, profiling="delayed:1")
    journal = Journal.create(run_dir)
    shutil.copyfile(DRY_RUN_REPLAY if args.cpu_dry_run else REPLAYS[args.backend], run_dir / "replay.jsonl")
    start_run(journal, [load_task(TASK)], "replay:replay.jsonl", agent_config, eval_config)
    provider = provider_from_spec("replay:replay.jsonl", ProviderSettings(state_dir=run_dir))

    started = time.perf_counter()
    agent = Agent(journal, provider, agent_config, eval_config)
    journal.begin_session(bench="agent_replay_h200")
    status = asyncio.run(agent.run(list(_tasks(journal))))
    result["first_session_s"] = round(time.perf_counter() - started, 1)
    results = [agent.result(t.task_id) for t in _tasks(journal)]
    write_outputs(journal, results)
    journal.append("exit", status=status, pending=[])
    result["exit_status"] = status
    _summarise(journal, results, result)
    _check_run(journal, result, "swish" if args.cpu_dry_run else FIRST_ERRORS[args.backend])
    _check_resume(journal, provider, agent_config, eval_config, result)
    return 0 if all(c["passed"] for c in result["checks"]) else 1


def _tasks(journal: Any) -> tuple:
    from cutegen.journal import load_run

    return load_run(journal).tasks


def _summarise(journal: Any, results: list, result: dict[str, Any]) -> None:
    from cutegen.records import to_json

    result["tasks"] = to_json(results)
    result["totals"] = journal.totals()
    steps = []
    for step in journal.steps():
        v = step.verdict
        steps.append({
            "index": step.index, "stage": step.stage, "round": step.round, "candidate": step.candidate_sha256,
            "bad_reply": step.bad_reply, "profile_shown": step.profile_shown, "new_best": step.improved,
            "passed": v.passed if v else None, "verdict_stage": v.stage if v else None,
            "failure": v.failure if v else None, "feedback": (v.feedback[:600] if v else None),
            "median_ms": v.timing.median_ms if v and v.timing else None,
            "noise_pct": v.noise_pct if v else None,
            "eager_ms": v.eager.median_ms if v and v.eager else None,
            "compile_ms": v.compiled.median_ms if v and v.compiled else None,
            "speedup_vs_eager": v.speedup_vs_eager if v else None,
            "speedup_vs_compile": v.speedup_vs_compile if v else None,
            "sol_fraction": v.sol_fraction if v else None, "build_s": v.build_s if v else None,
            "gpu_s": v.gpu_s if v else None,
        })
    result["steps"] = steps


def _check(result: dict[str, Any], name: str, passed: bool, detail: str) -> None:
    result["checks"].append({"name": name, "passed": bool(passed), "detail": detail})


def _check_run(journal: Any, result: dict[str, Any], error_needle: str) -> None:
    steps = result["steps"]
    _check(result, "exit_status_0", result["exit_status"] == 0, f"status {result['exit_status']}")
    _check(result, "stage_sequence", [s["stage"] for s in steps] == EXPECTED_STAGES,
           " -> ".join(s["stage"] for s in steps))
    first = steps[0] if steps else {}
    _check(result, "compile_error_caught", first.get("verdict_stage") == "build" and not first.get("passed")
           and error_needle in (first.get("feedback") or ""), f"{first.get('failure')}: {first.get('feedback')!r:.200}")
    _check(result, "three_correct_kernels", all(s["passed"] for s in steps[1:]) and len(steps) == 4,
           ", ".join(str(s["passed"]) for s in steps))
    _check(result, "profile_block_from_round_2", [s["profile_shown"] for s in steps] == [False, False, False, True],
           str([s["profile_shown"] for s in steps]))
    passing = [s for s in steps if s["passed"] and s["median_ms"] is not None]
    task = result["tasks"][0] if result.get("tasks") else {}
    fastest = min(passing, key=lambda s: s["median_ms"]) if passing else None
    chosen = next((s for s in passing if s["candidate"] == task.get("best_sha256")), None)
    # The agent keeps the incumbent unless a newcomer is faster by min_gain (2%) or by the measured
    # baseline noise when that is larger, so the chosen kernel is the fastest or the fastest does not
    # beat it by that margin. (Written as the agent's own comparison: on a loaded CPU the noise can pass
    # 100%, where dividing by 1 - gain flipped the sign and failed a run that chose the fastest.)
    gain = max([0.02] + [s["noise_pct"] / 100.0 for s in passing if s["noise_pct"] is not None])
    ok = (chosen is not None and fastest is not None
          and not fastest["median_ms"] < chosen["median_ms"] * (1.0 - gain) - 1e-9)
    _check(result, "best_is_chosen", ok, f"chosen {chosen and chosen['median_ms']} ms (step"
           f" {chosen and chosen['index']}), fastest {fastest and fastest['median_ms']} ms")
    best_file = journal.run_dir / "best" / "swish_scale.py"
    _check(result, "best_file_written", best_file.is_file() and "class ModelNew" in best_file.read_text(),
           str(best_file.relative_to(journal.run_dir)))


def _check_resume(journal: Any, provider: Any, agent_config: Any, eval_config: Any, result: dict[str, Any]) -> None:
    """A second session over the finished run: everything comes from the journal."""
    from cutegen.agent import Agent
    from cutegen.journal import Journal

    reopened = Journal.open(journal.run_dir)
    before = {kind: len(reopened.of_kind(kind)) for kind in ("reply", "evaluate", "step")}
    served_log = journal.run_dir / "replay_served.jsonl"
    served_before = len(served_log.read_text().splitlines()) if served_log.exists() else 0
    agent = Agent(reopened, provider, agent_config, eval_config)
    reopened.begin_session(bench="agent_replay_h200 resume")
    status = asyncio.run(agent.run(list(_tasks(reopened))))
    after = {kind: len(reopened.of_kind(kind)) for kind in ("reply", "evaluate", "step")}
    served_after = len(served_log.read_text().splitlines()) if served_log.exists() else 0
    _check(result, "resume_repeats_nothing", status == 0 and before == after and served_before == served_after,
           f"status {status}; records before {before}, after {after}; replies served {served_before} -> {served_after}")


def _manifest() -> dict[str, Any]:
    from cutegen.cli import env
    from cutegen.manifest import machine_manifest

    return machine_manifest(env.runtime_config())


def _write(out: Path, run_dir: Path, result: dict[str, Any]) -> None:
    (out / "agent_replay.json").write_text(json.dumps(result, indent=1, default=str))
    evaluation = result.get("evaluation") or {}
    lines = [f"# Agent workflow with recorded replies (swish_scale, backend {evaluation.get('backend')},"
             f" device {evaluation.get('device')})", "",
             "Replies are hand-written and replayed (examples/replays/): this checks the workflow and the",
             "evaluator on real kernels; it is not a model's result.", ""]
    manifest = result.get("manifest") or {}
    lines.append(f"Machine: {manifest.get('gpu_name')}, driver {manifest.get('driver_version')}, torch"
                 f" {manifest.get('torch_version')}, nvcc {manifest.get('nvcc_version')}, CUTLASS"
                 f" {manifest.get('cutlass_version')}.")
    lines += check_lines(result)
    report = run_dir / "report.md"
    if report.is_file():
        lines += ["", "---", "", report.read_text()]
    (out / "agent_replay.md").write_text("\n".join(lines) + "\n")
    if (run_dir / "journal.jsonl").is_file():
        shutil.copyfile(run_dir / "journal.jsonl", out / "journal.jsonl")


if __name__ == "__main__":
    sys.exit(main())
