"""The anticheat stage: which dynamic checks of checks_dynamic.py run for which backend, and how their
observations are judged in the parent. Each check's docstring (in checks_dynamic.py) names the exploit
it defeats; this module only decides where each applies and what counts as a failure. The candidate's
worker (runner.py) runs the observations; pipeline.py asks for them by this table.

- op audit (`disallowed_ops`, own kernels required: cute, cuda): one forward under a
  TorchDispatchMode; any aten op other than allocation and views fails.
- kernel audit (`audit_kernels`, own kernels required, on CUDA): a profiled forward must launch the
  candidate's own kernels and no library (cuBLAS/cuDNN/aten compute) kernels. It runs last, after
  timing: a profiler session can leave CUPTI attached to the process (the workers ask Kineto to
  detach it, but a torch that ignores the request would not), and every later launch would then pay
  microseconds of callback overhead, which event timing of a short kernel counts.
- ghost probe (every backend): perturbing an input must change the output as it changes the
  reference's.
Global state and new threads are checked after every stage by the pipeline, for every backend.
"""

from __future__ import annotations

from typing import Any

from cutegen.evaluate.checks import backends_of
from cutegen.records import CheckResult

# Where each dynamic check of this stage applies, as the registry (checks.py) says; the static ones are
# in checks_static.STATIC_CHECK_BACKENDS. The audits enforce "the candidate's own kernels do the work",
# which a torch candidate is allowed not to do; the probe catches a cheat any backend could try.
DYNAMIC_CHECK_BACKENDS: dict[str, frozenset[str]] = {
    name: backends_of(name) for name in ("disallowed_ops", "audit_kernels", "ghost_probe")
}


def applies(check: str, backend: str) -> bool:
    """Whether dynamic check `check` (a key of DYNAMIC_CHECK_BACKENDS) judges a `backend` candidate."""
    return backend in DYNAMIC_CHECK_BACKENDS[check]


def judge_dynamic_checks(data: dict[str, Any], backend: str) -> list[CheckResult]:
    """In the parent: one CheckResult per dynamic check, in the order they are reported."""
    checks = []
    if "disallowed_ops" in data:
        bad = data["disallowed_ops"]
        checks.append(CheckResult(
            "disallowed_ops", "anticheat", not bad,
            f"forward ran torch compute ops {', '.join(bad[:8])}; with the {backend} backend only allocation and"
            " view ops may run in torch, the computation must be in the candidate's own kernels" if bad
            else f"{len(data['ops'])} distinct aten ops, all allocation or views"))
    if data.get("kernels") is not None:
        checks.append(_judge_kernels(data["kernels"]))
    if "ghost" in data:
        ghost = data["ghost"]
        checks.append(CheckResult("ghost_probe", "anticheat", not ghost, ghost or "the output follows the inputs"))
    return checks


def _judge_kernels(kernels: dict[str, Any]) -> CheckResult:
    library, own = list(kernels.get("library_kernels", [])), list(kernels.get("own_kernels", []))
    if library:
        detail = (f"library kernels ran during forward: {', '.join(map(str, library[:5]))}; the computation"
                  " must be done by the candidate's own kernels")
    elif not own:
        detail = "none of the candidate's own kernels ran during forward"
    else:
        return CheckResult("audit_kernels", "anticheat", True, f"own kernels: {', '.join(map(str, own[:5]))}")
    return CheckResult("audit_kernels", "anticheat", False, detail)
