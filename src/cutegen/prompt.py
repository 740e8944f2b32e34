"""Render the prompt templates (src/cutegen/templates, Jinja with strict undefined) into messages.

Every prompt is a system message and one user message holding everything its stage needs (the task,
the kernel under work, the evaluator's feedback): stateless prompts make a replayed run compute the
same request ids and let any stage be answered by a fresh model (or a person) without a transcript.
"""

from __future__ import annotations

import functools
from typing import Any

from cutegen.records import WORKLOAD_CLASSES, Message, TaskTrace, Verdict

# The user template of each stage; repair stages are picked from the verdict (`repair_stage`).
STAGES = ("generate", "repair_build", "repair_correctness", "optimize")


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("cutegen", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(name: str, **context: Any) -> str:
    """One template rendered with `context`; a variable the template uses but is not given raises."""
    return _environment().get_template(name).render(**context)


def messages(stage: str, *, backend: str, track: str, **context: Any) -> tuple[Message, ...]:
    """The system message and the `stage` user message (`templates/<stage>.md.j2`)."""
    if stage not in STAGES:
        raise ValueError(f"unknown prompt stage {stage!r}; expected one of {STAGES}")
    system = render_template("system.md.j2", backend=backend, track=track)
    user = render_template(f"{stage}.md.j2", backend=backend, track=track, **context)
    return (Message("system", system.strip() + "\n"), Message("user", user.strip() + "\n"))


def repair_stage(verdict: Verdict) -> str:
    """Which repair prompt a failed verdict calls for: build errors (nvcc, import) or the rest."""
    return "repair_build" if verdict.stage == "build" else "repair_correctness"


def trace_context(trace: TaskTrace) -> dict[str, Any]:
    """What the templates show of a trace."""
    workload = trace.workload_class if trace.workload_class in WORKLOAD_CLASSES else "other"
    return {
        "workload_class": workload,
        "aten_ops": list(trace.aten_ops),
        "flops": trace.flops,
        "min_bytes": trace.min_bytes,
    }


def measurements(verdict: Verdict) -> str:
    """One line of what a passing verdict measured, in units a model can compare."""
    parts = []
    if verdict.timing is not None:
        parts.append(f"median {verdict.timing.median_ms:.4g} ms")
    if verdict.speedup_vs_eager is not None:
        parts.append(f"{verdict.speedup_vs_eager:.3g}x eager PyTorch")
    if verdict.speedup_vs_compile is not None:
        parts.append(f"{verdict.speedup_vs_compile:.3g}x torch.compile")
    if verdict.sol_fraction is not None:
        parts.append(f"{verdict.sol_fraction:.1%} of the speed-of-light bound")
    return ", ".join(parts) + "." if parts else "not timed."
