"""What every worker job sets up in its process: the precision track's flags, the task and the
runtime settings from the job's JSON, and the hooks that differ between a CUDA and a CPU run. Shared
by the reference process (reference.py) and the candidate's worker (runner.py)."""

from __future__ import annotations

from typing import Any

from cutegen.config import RuntimeConfig
from cutegen.records import Task, from_json

CANDIDATE_FILE = "candidate.py"  # the candidate's source, written in its worker's working directory


def apply_track(track: str) -> None:
    """TF32 off everywhere on the fp32 track, on for matmul and cuDNN on the tf32 track."""
    import torch  # lazy: loading torch takes seconds

    tf32 = track == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def task_from_json(data: dict[str, Any]) -> Any:
    return from_json(Task, data)


def runtime_from_json(data: dict[str, Any] | None) -> Any:
    return from_json(RuntimeConfig, data) if data else RuntimeConfig()


class Hooks:
    """What differs between a CUDA and a CPU run."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def churn(self) -> int:
        """checks_dynamic.churn_free_memory on CUDA: the bytes it gave back to the driver (0 on a CPU)."""
        if self.cuda:
            from cutegen.evaluate.checks_dynamic import churn_free_memory  # lazy: checks_dynamic loads torch

            return churn_free_memory(self.device)
        return 0

    def synchronize(self) -> None:
        if self.cuda:
            import torch  # lazy: loading torch takes seconds

            torch.cuda.synchronize()
