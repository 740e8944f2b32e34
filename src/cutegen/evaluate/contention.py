"""A GPU shared with other processes: an evaluation that runs out of device memory or time while
processes outside this evaluator hold the GPU is not a verdict on the candidate.

Four `cutegen eval` runs started at once on one GPU each fill the free memory with NaN before their
candidate's calls (checks_dynamic.churn_free_memory) and each time their candidates: an honest kernel
of one of them ran out of memory, or past its time limit, because of the others. Here such a failure
is measured again after a wait (`BUSY_WAITS_S`), and if the others are still there at the end it
becomes the infrastructure verdict `gpu_busy` (Verdict.infrastructure), which says so, instead of the
candidate's `out_of_memory` or `run_timeout`.

"Outside this evaluator" is every process using the GPU that is not this process or one of its
descendants (its workers and reference processes), as `nvidia-smi` lists the GPU's compute processes
and as PyTorch's out-of-memory message names them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from cutegen.evaluate.service import driver_use
from cutegen.evaluate.worker import descendants

BUSY_FAILURES = frozenset({"out_of_memory", "run_timeout"})
BUSY_WAITS_S = (5.0, 15.0, 30.0)  # before each new attempt while other processes hold the GPU


def gpu_processes(gpu: int | None) -> dict[int, int]:
    """{pid: bytes} of the compute processes on GPU `gpu`, from nvidia-smi; {} where it cannot tell."""
    smi = shutil.which("nvidia-smi")
    if smi is None or gpu is None:
        return {}
    try:
        out = subprocess.run([smi, f"--id={gpu}", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit():
            found[int(pid)] = int(float(mib.strip() or 0) * (1 << 20)) if mib.strip().replace(".", "").isdigit() else 0
    return found


def foreign_gpu_use(gpu: int | None, message: str = "") -> dict[int, int]:
    """{pid: bytes} of the processes on the GPU that are not this evaluator's (this process and its
    descendants), from nvidia-smi and the out-of-memory `message`."""
    ours = {os.getpid(), *descendants(os.getpid())}
    seen = {**driver_use(message), **gpu_processes(gpu)}
    return {pid: used for pid, used in seen.items() if pid not in ours}


def describe(foreign: dict[int, int]) -> str:
    held = sum(foreign.values()) / 2**30
    return f"{len(foreign)} other process(es) ({', '.join(map(str, sorted(foreign)[:6]))}) holding {held:.1f} GiB"
