"""The anticheat stage: runs the dynamic checks of checks_dynamic.py in the worker and judges them in
the parent. Each check's docstring (in checks_dynamic.py) names the exploit it defeats; this module
only decides which run where and what counts as a failure.

- op audit (backend cute): one forward under a TorchDispatchMode; any aten op other than allocation
  and views fails.
- kernel audit (backend cute, CUDA): a profiled forward must launch the candidate's own kernels and no
  library (cuBLAS/cuDNN/aten compute) kernels. It runs last, after timing (`run_kernel_audit`): a
  profiler session can leave CUPTI attached to the process (the workers ask Kineto to detach it, but
  a torch that ignores the request would not), and every later launch would then pay microseconds
  of callback overhead, which event timing of a short kernel counts.
- ghost probe (always): perturbing an input must change the output as it changes the reference's.
Global state and new threads are checked after every stage by the pipeline.
"""

from __future__ import annotations

from typing import Any

from cutegen.records import CheckResult, to_json


def run_dynamic_checks(model: Any, ref_model: Any, inputs: list[Any], device: Any, backend: str,
                       hooks: Any, tol: float) -> dict[str, Any]:
    """In the worker: raw observations of the dynamic checks on one set of inputs."""
    import torch

    from cutegen.evaluate import checks_dynamic as dyn
    from cutegen.evaluate.correctness import to_device

    def forward(*xs: Any) -> Any:
        with torch.no_grad():
            return model(*xs)

    def run_candidate(*xs: Any) -> Any:
        return forward(*to_device(list(xs), device))

    def run_reference(*xs: Any) -> Any:
        with torch.no_grad():
            return ref_model(*to_device(list(xs), device))

    result: dict[str, Any] = {}
    args = to_device(inputs, device)
    if backend == "cute":
        with dyn.OpAudit() as audit:
            forward(*args)
        hooks.synchronize()
        result["ops"] = sorted(set(audit.ops))
        result["disallowed_ops"] = dyn.disallowed_ops(audit.ops, backend)
    result["ghost"] = dyn.ghost_probe(run_candidate, run_reference, inputs, tol=tol)
    return result


def run_kernel_audit(model: Any, inputs: list[Any], device: Any) -> dict[str, Any]:
    """In the worker, after timing: the kernels one forward launches (the parent asks for it with
    backend cute on CUDA only)."""
    import torch

    from cutegen.evaluate import checks_dynamic as dyn
    from cutegen.evaluate.correctness import to_device

    def forward(*xs: Any) -> Any:
        with torch.no_grad():
            return model(*xs)

    return {"kernels": to_json(dyn.audit_kernels(forward, to_device(inputs, device)))}


def judge_dynamic_checks(data: dict[str, Any], backend: str) -> list[CheckResult]:
    """In the parent: one CheckResult per dynamic check, in the order they are reported."""
    checks = []
    if "disallowed_ops" in data:
        bad = data["disallowed_ops"]
        checks.append(CheckResult(
            "disallowed_ops", "anticheat", not bad,
            f"forward ran torch compute ops {', '.join(bad[:8])}; with the cute backend only allocation and"
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
