"""The process Nsight Compute profiles: `python -m cutegen.profile.driver JOB.json` in a fresh folder.

It builds the candidate (the build cache usually has it), makes the task's inputs and weights from
the job's seed, runs `warmup` forwards unprofiled, then `forwards` forwards between
cudaProfilerStart and cudaProfilerStop. ncu runs with `--profile-from-start off`, so exactly those
forwards are profiled, not the warm-up nor the framework's own setup kernels. Before the profiled
forwards it writes `meta.json` (the candidate's libraries, the input dtype, the device, torch's
version) and after them `done.json`; the parent reads both, and ncu's report, never this process's
stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cutegen.evaluate.context import apply_track, runtime_from_json
from cutegen.evaluate.correctness import build_model, lowest_precision, make_inputs, tensors_of, to_device
from cutegen.evaluate.runner import import_and_build
from cutegen.records import Task, from_json
from cutegen.runtime import find_kernels, use_config
from cutegen.tasks import task_module


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)  # the parent never reads a half-written file


def run(job: dict[str, Any], folder: Path) -> None:
    import torch  # lazy: loading torch takes seconds

    apply_track(job["track"])
    runtime = runtime_from_json(job.get("runtime"))
    device = torch.device("cuda", 0)
    with use_config(runtime):
        module = task_module(from_json(Task, job["task"]))
        torch.manual_seed(job["seed"])
        init_inputs = list(module.get_init_inputs())
        candidate, _ = import_and_build(job["source"], runtime)
        model = build_model(candidate.ModelNew, init_inputs, job["seed"], device)
        inputs = to_device(make_inputs(module, job["seed"], None, device), device)
        with torch.no_grad():
            for _ in range(job["warmup"]):
                model(*inputs)
            torch.cuda.synchronize()
            _write(folder / "meta.json", {
                "libraries": [str(k.build_result.library_path) for k in find_kernels(candidate) if k.build_result],
                "dtype": lowest_precision(tensors_of(inputs)), "device_name": torch.cuda.get_device_name(0),
                "torch_version": torch.__version__,
            })
            torch.cuda.profiler.start()
            for _ in range(job["forwards"]):
                model(*inputs)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    _write(folder / "done.json", {"forwards": job["forwards"]})


def main(argv: list[str]) -> int:
    job_path = Path(argv[0]).resolve()
    run(json.loads(job_path.read_text(encoding="utf-8")), job_path.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
