"""Run Nsight Compute on one forward of a candidate, in the evaluator's isolation style, and build its Profile.

The protocol of `profile_candidate`:

- ncu runs the driver (`python -m cutegen.profile.driver`, see driver.py) in a fresh temporary folder
  (also its TMPDIR) with the evaluator's allow-listed environment (`worker_environment`: only the
  toolchain's and Python's variables, `CUDA_VISIBLE_DEVICES` pinned to one GPU) plus LC_ALL=C, in a
  process group of its own; past `timeout_s` the whole group (ncu and the candidate) is killed.
- ncu options: `--clock-control none` (the GPU runs at the clocks the evaluator times it at; clocks are
  never changed), `--profile-from-start off` (only the forwards between cudaProfilerStart/Stop),
  `--target-processes application-only` (nvcc, should the candidate need a build, is not a target),
  `--launch-count max_launches`, the sections of metrics.SECTIONS and, when this ncu lists them, the
  extra metrics of metrics.EXTRA_METRICS; caches are flushed before each replay pass (ncu's default),
  as the evaluator flushes L2 before each timed call. The results go to a report file, which is
  turned into the raw-page CSV by a second, trusted `ncu --import`: nothing the candidate prints can
  pose as a measurement.
- The candidate's own launches are those whose kernel symbol is in one of the libraries it built;
  the rest (PyTorch kernels of its forward) are listed as other kernels and left out of the totals.
- The instruction mix comes from `cuobjdump -sass` of those libraries (sass.py).
- ncu missing, no permission to read the GPU counters, a timeout, a candidate that fails, or a forward
  with no kernel raise ProfileUnavailable, whose message says what to do; the agent's profiler turns it
  into "no profile" and carries on.

This is a robust harness, not a security sandbox (see evaluate/worker.py).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from cutegen.config import EvalConfig, ProfileConfig
from cutegen.errors import CutegenError
from cutegen.evaluate.pipeline import read_candidate
from cutegen.evaluate.sol import datasheet_peaks, load_peaks, peaks_path, work_bound_ms
from cutegen.evaluate.worker import worker_environment
from cutegen.profile import metrics
from cutegen.profile.diagnose import build_profile, profile_text, short_name, split_own
from cutegen.profile.ncu_csv import parse_ncu_csv
from cutegen.profile.sass import mix_findings, parse_sass, run_cuobjdump
from cutegen.records import InstructionMix, Profile, Task, to_json
from cutegen.tasks import source_sha256
from cutegen.trace import trace_task

CUDA_BIN = Path("/usr/local/cuda/bin")
REPORT = "profile"  # ncu writes profile.ncu-rep
LOG_TAIL_BYTES = 6000
PERMANENT = ("ncu_missing", "no_permission")  # reasons that will not change within a session


class ProfileUnavailable(CutegenError):
    """No profile could be made; `reason` is one of ncu_missing, no_permission, timeout,
    candidate_failed, no_kernels, ncu_failed."""

    def __init__(self, reason: str, problem: str, fix: str, log_tail: str = "") -> None:
        super().__init__(problem, fix)
        self.reason = reason
        self.log_tail = log_tail


@dataclass
class Collected:
    """What one ncu run produced, before interpretation."""

    csv_text: str  # the raw page of the report
    meta: dict[str, Any]  # the driver's meta.json: libraries, dtype, device_name, torch_version
    tool: str  # the ncu version line
    metrics_missing: tuple[str, ...]
    sections_only: bool  # the extra metrics were dropped (this ncu rejected the run with them)
    log_tail: str
    ncu_s: float
    report: bytes | None = field(default=None, repr=False)  # the .ncu-rep file, when asked to keep it


# --------------------------------------------------------------------------------------------- tools


def find_tool(configured: str | None, name: str) -> str | None:
    """`configured` (a path or a name on PATH), else `name` on PATH, else /usr/local/cuda/bin/name."""
    if configured:
        return shutil.which(configured)
    found = shutil.which(name)
    fallback = CUDA_BIN / name
    if found is None and fallback.is_file() and os.access(fallback, os.X_OK):
        found = str(fallback)
    return found


def require_ncu(config: ProfileConfig) -> str:
    ncu = find_tool(config.ncu, "ncu")
    if ncu is None:
        where = config.ncu or f"PATH or {CUDA_BIN}"
        raise ProfileUnavailable("ncu_missing", f"Nsight Compute (ncu) was not found ({where}): no profile is made.",
                                 "Install Nsight Compute (it ships with the CUDA toolkit) and put ncu on PATH, or"
                                 " pass its path with --ncu (ProfileConfig.ncu).")
    return ncu


@functools.lru_cache(maxsize=None)
def ncu_version(ncu: str) -> str:
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"ncu (version unknown: {err})"
    lines = [line.strip() for line in done.stdout.splitlines() if "version" in line.lower()]
    return lines[-1] if lines else "ncu (version unknown)"


@functools.lru_cache(maxsize=None)
def _listed_metrics(ncu: str, gpu: int, timeout_s: float) -> frozenset[str] | None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "LC_ALL": "C"}
    try:
        done = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=timeout_s,
                              env=env, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    listed = metrics.parse_query_metrics(done.stdout)
    return listed if done.returncode == 0 and listed else None


def _run_group(command: list[str], cwd: Path, env: dict[str, str], timeout_s: float, log: Path) -> int | None:
    """Run `command` in its own process group with its output in `log`; None when it ran past
    `timeout_s` (then the whole group, the candidate included, has been killed)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        finally:
            if proc.poll() is None:  # an exception (KeyboardInterrupt) in the wait: leave nothing behind
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------ the run


def ncu_command(ncu: str, config: ProfileConfig, extra: tuple[str, ...],
                sections: tuple[str, ...] = metrics.SECTIONS) -> list[str]:
    command = [ncu, "--clock-control", "none", "--profile-from-start", "off",
               "--target-processes", "application-only", "--launch-count", str(config.max_launches),
               "--export", REPORT, "--force-overwrite"]
    for section in sections:
        command += ["--section", section]
    if extra:
        command += ["--metrics", ",".join(extra)]
    return command + [sys.executable, "-m", "cutegen.profile.driver", "job.json"]


def _failure(returncode: int | None, workdir: Path, log: str, timeout_s: float) -> ProfileUnavailable | None:
    """Why a run produced no usable report (None when it did)."""
    if returncode is None:
        return ProfileUnavailable("timeout", f"Profiling did not finish within {timeout_s:g} s and was stopped.",
                                  "Raise the profile timeout (--timeout, ProfileConfig.timeout_s); a first build of"
                                  " the candidate counts against it (evaluate it first to fill the build cache).",
                                  log)
    if "ERR_NVGPUCTRPERM" in log:
        return ProfileUnavailable("no_permission", "Nsight Compute may not read this GPU's performance counters"
                                  " (ERR_NVGPUCTRPERM).", "Profile as root, or let every user read the counters"
                                  " (the nvidia kernel module option NVreg_RestrictProfilingToAdminUsers=0).", log)
    if not (workdir / "done.json").is_file() and "Traceback (most recent call last)" in log:
        return ProfileUnavailable("candidate_failed", "The candidate failed while being profiled:\n"
                                  + log[-1500:], "Evaluate the candidate first (cutegen eval); only a candidate"
                                  " that runs can be profiled.", log)
    if not (workdir / "done.json").is_file():  # ncu itself stopped (a rejected option or metric, a crash)
        return ProfileUnavailable("ncu_failed", f"ncu exited with status {returncode} before the profiled forward"
                                  " completed:\n" + log[-1500:], "Run the ncu command by hand to see why.", log)
    if "No kernels were profiled" in log and "==ERROR==" in log:  # kernels ran but ncu could not measure them
        return ProfileUnavailable("ncu_failed", "ncu could not profile the forward's kernels:\n" + log[-1500:],
                                  "Run the ncu command by hand to see why.", log)
    if "No kernels were profiled" in log:
        return ProfileUnavailable("no_kernels", "The profiled forward launched no kernel.", "Check that forward"
                                  " launches the candidate's kernels on every call.", log)
    if not (workdir / f"{REPORT}.ncu-rep").is_file():
        return ProfileUnavailable("ncu_failed", f"ncu exited with status {returncode} without a report:\n"
                                  + log[-1500:], "Run the printed ncu command by hand to see why.", log)
    return None


def _import_csv(ncu: str, workdir: Path, env: dict[str, str], timeout_s: float) -> str:
    """The report's raw page as CSV, kernels named by their mangled symbols (ncu's default names when
    this ncu does not know the option)."""
    base = [ncu, "--import", f"{REPORT}.ncu-rep", "--csv", "--page", "raw"]
    for command in (base + ["--print-kernel-base", "mangled"], base):
        try:
            done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s,
                                  check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ProfileUnavailable("ncu_failed", f"`ncu --import` did not finish within {timeout_s:g} s.",
                                     "Raise ProfileConfig.tool_timeout_s.") from None
        if done.returncode == 0 and '"ID"' in done.stdout:
            return done.stdout
    raise ProfileUnavailable("ncu_failed", f"`ncu --import` failed (exit {done.returncode}):"
                             f" {(done.stderr or done.stdout)[-800:]}", "Check the ncu installation.")


def _job(source: str, task: Task, config: ProfileConfig, eval_config: EvalConfig) -> dict[str, Any]:
    return {"source": source, "task": to_json(task), "runtime": to_json(eval_config.runtime),
            "track": eval_config.track, "seed": config.seed, "warmup": config.warmup, "forwards": config.forwards}


def collect(source: str, task: Task, config: ProfileConfig, eval_config: EvalConfig, gpu: int | None = None,
            keep_report: bool = False) -> Collected:
    """Profile one forward of `source` (see the module docstring); raises ProfileUnavailable."""

    ncu = require_ncu(config)
    gpu = eval_config.gpus[0] if gpu is None else gpu
    wanted = metrics.EXTRA_METRICS if config.extra_metrics else ()
    extra, missing = metrics.available_metrics(wanted, _listed_metrics(ncu, gpu, config.tool_timeout_s))
    workdir = Path(tempfile.mkdtemp(prefix="cutegen-profile-"))
    try:
        env = {**worker_environment(dict(os.environ), "cuda", gpu, workdir), "LC_ALL": "C"}
        (workdir / "job.json").write_text(json.dumps(_job(source, task, config, eval_config)), encoding="utf-8")
        started = time.perf_counter()
        # Fewer metrics after each rejection: ours, then the sections alone, then a minimal set.
        attempts = [(metrics.SECTIONS, extra)] * bool(extra) + [(metrics.SECTIONS, ()),
                                                                (metrics.FALLBACK_SECTIONS, metrics.FALLBACK_METRICS)]
        for sections, attempt in attempts:
            for stale in ("meta.json", "done.json", f"{REPORT}.ncu-rep"):
                (workdir / stale).unlink(missing_ok=True)
            code = _run_group(ncu_command(ncu, config, attempt, sections), workdir, env, config.timeout_s,
                              workdir / "ncu.log")
            log = _tail(workdir / "ncu.log")
            failure = _failure(code, workdir, log, config.timeout_s)
            if failure is None or failure.reason != "ncu_failed":
                break  # a candidate, permission or time problem is not cured by fewer metrics
        if failure is not None:
            raise failure
        csv_text = _import_csv(ncu, workdir, env, config.tool_timeout_s)
        return Collected(csv_text=csv_text, meta=json.loads((workdir / "meta.json").read_text(encoding="utf-8")),
                         tool=ncu_version(ncu), metrics_missing=missing if attempt == extra else wanted,
                         sections_only=bool(extra) and attempt != extra, log_tail=log,
                         ncu_s=time.perf_counter() - started,
                         report=(workdir / f"{REPORT}.ncu-rep").read_bytes() if keep_report else None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------------- interpretation


def instruction_mixes(config: ProfileConfig, libraries: list[Path]) -> tuple[tuple[InstructionMix, ...], str | None]:
    """The SASS instruction mix of every kernel in `libraries`; (mixes, why none) when cuobjdump fails."""

    cuobjdump = find_tool(config.cuobjdump, "cuobjdump")
    if cuobjdump is None:
        return (), "cuobjdump not found: no instruction mix"
    mixes: list[InstructionMix] = []
    for library in libraries:
        try:
            mixes += parse_sass(run_cuobjdump(cuobjdump, library, config.tool_timeout_s))
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as err:
            return tuple(mixes), f"cuobjdump failed: {err}"
    return tuple(mixes), None


def demangle(symbols: list[str]) -> dict[str, str]:
    """Short readable names of kernel symbols (cu++filt or c++filt; the symbol itself without them)."""

    tool = find_tool(None, "cu++filt") or find_tool(None, "c++filt")
    if tool is None or not symbols:
        return {s: s for s in symbols}
    try:
        done = subprocess.run([tool], input="\n".join(symbols) + "\n", capture_output=True, text=True, timeout=30,
                              check=False)
        plain = done.stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        plain = []
    if len(plain) != len(symbols):
        return {s: s for s in symbols}
    return {s: short_name(p) for s, p in zip(symbols, plain)}


def sol_bound_s(trace: Any, eval_config: EvalConfig, meta: dict[str, Any]) -> float | None:
    """The reference algorithm's work bound (evaluate/sol.py: work_bound_ms) with the evaluator's peaks
    for this device, measured and cached by an evaluation, else the datasheet's, each raised to the
    hardware's (the bound the verdict's fraction is of); None for an unknown device."""

    name = meta.get("device_name") or ""
    peaks = load_peaks(peaks_path(eval_config.cache_dir, name, meta.get("torch_version", ""))) or datasheet_peaks(name)
    if peaks is None:
        return None
    bound = work_bound_ms(trace, peaks, eval_config.track, meta.get("dtype") in ("float16", "bfloat16"))
    return bound * 1e-3 if bound is not None else None


def interpret(collected: Collected, source: str, task: Task, config: ProfileConfig, eval_config: EvalConfig,
              wall_s: float | None = None) -> Profile:
    """The Profile of a collected run: own launches, instruction mix, speed of light, diagnosis."""

    libraries = [Path(p) for p in collected.meta.get("libraries", []) if Path(p).is_file()]
    blobs = [library.read_bytes() for library in libraries]
    own, others = split_own(parse_ncu_csv(collected.csv_text), blobs)
    if not own:
        raise ProfileUnavailable("no_kernels", "None of the profiled kernels is the candidate's own"
                                 f" (profiled: {', '.join(others) or 'none'}).",
                                 "Launch the candidate's own kernels from forward.")
    mixes, mix_error = instruction_mixes(config, libraries)
    trace = trace_task(task)
    findings = mix_findings(mixes, source, trace.workload_class, eval_config.track, eval_config.backend) + (
        (mix_error,) if mix_error else ())
    names = demangle(sorted({launch.kernel_name for launch in own} | {m.function for m in mixes}))
    return build_profile(own, task_id=task.task_id, candidate_sha256=source_sha256(source), tool=collected.tool,
                         device_name=collected.meta.get("device_name"), mixes=mixes, findings=findings,
                         other_kernels=tuple(others), names=names, workload_class=trace.workload_class,
                         track=eval_config.track, sol_bound_s=sol_bound_s(trace, eval_config, collected.meta),
                         metrics_missing=collected.metrics_missing, wall_s=wall_s, backend=eval_config.backend)


def profile_candidate(candidate_path: Path, task: Task, config: ProfileConfig, eval_config: EvalConfig,
                      gpu: int | None = None) -> Profile:
    """Profile one forward of the candidate at `candidate_path` for `task` (module docstring)."""

    started = time.perf_counter()
    source = read_candidate(Path(candidate_path))
    collected = collect(source, task, config, eval_config, gpu)
    profile = interpret(collected, source, task, config, eval_config)
    return _with_wall(profile, time.perf_counter() - started)


def _with_wall(profile: Profile, wall_s: float) -> Profile:
    return replace(profile, wall_s=round(wall_s, 3))


# ------------------------------------------------------------------------------------------ agent


class NcuProfiler:
    """The agent's `profiler`: `(candidate_path, task, eval_config) -> text | None`.

    A profile that cannot be made gives None (the prompt then says none is available) and a message
    to `notify`; after ncu is found missing or without counter permission it stops trying.
    """

    def __init__(self, config: ProfileConfig | None = None, notify: Callable[[str], None] | None = None) -> None:
        self.config = config or ProfileConfig()
        self.notify = notify or (lambda message: print(message, file=sys.stderr))
        self.disabled: ProfileUnavailable | None = None
        self.profiles: list[Profile] = []  # every profile made, for a caller that wants the numbers

    def __call__(self, candidate_path: Path, task: Task, eval_config: EvalConfig) -> str | None:
        if self.disabled is not None or eval_config.device != "cuda":
            return None
        try:
            profile = profile_candidate(candidate_path, task, self.config, eval_config)
        except ProfileUnavailable as err:
            if err.reason in PERMANENT:
                self.disabled = err
            self.notify(f"profile of {task.task_id} skipped ({err.reason}): {err}")
            return None
        self.profiles.append(profile)
        return profile_text(profile)


def make_profiler(config: ProfileConfig | None = None, notify: Callable[[str], None] | None = None) -> NcuProfiler:
    """A profiler for `cutegen.agent.Agent(profiler=...)`."""
    return NcuProfiler(config, notify)
