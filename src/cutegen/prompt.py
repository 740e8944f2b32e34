"""Render the prompt templates (src/cutegen/templates, Jinja with strict undefined) into messages.

Every prompt is a system message and one user message holding everything its stage needs (the task,
the kernel under work, the evaluator's feedback): stateless prompts make a replayed run compute the
same request ids and let any stage be answered by a fresh model (or a person) without a transcript.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jinja2

from cutegen.extract import prose_lines, shorten_idea
from cutegen.records import WORKLOAD_CLASSES, Message, TaskTrace, Verdict

# The user template of each stage; repair stages are picked from the verdict (`repair_stage`);
# "directions" asks for distinct optimization directions before side-by-side proposals.
STAGES = ("generate", "repair_build", "repair_correctness", "optimize", "directions")
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+(?P<text>\S.*)$")


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
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


def messages(stage: str, *, backend: str, track: str, tolerances: tuple[tuple[str, str], ...] = (),
             **context: Any) -> tuple[Message, ...]:
    """The system message and the `stage` user message (`templates/<stage>.md.j2`). `tolerances`:
    (output dtype, "atol = rtol = ...") pairs (`tolerances`); empty: the track's fp32 tolerance."""
    if stage not in STAGES:
        raise ValueError(f"unknown prompt stage {stage!r}; expected one of {STAGES}")
    system = render_template("system.md.j2", backend=backend, track=track, tolerances=list(tolerances))
    user = render_template(f"{stage}.md.j2", backend=backend, track=track, **context)
    return (Message("system", system.strip() + "\n"), Message("user", user.strip() + "\n"))


def repair_stage(verdict: Verdict) -> str:
    """Which repair prompt a failed verdict calls for: build errors (nvcc, import) or the rest."""
    return "repair_build" if verdict.stage == "build" else "repair_correctness"


def tolerances(config: Any, output_dtypes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """What the evaluator applies to each output dtype (EvalConfig.tolerance: the track's value for
    fp32, 2e-2 for half precision, or the configured override), as (dtype, "atol = ..., rtol = ...")."""
    pairs = []
    for dtype in output_dtypes:
        atol, rtol = config.tolerance(dtype)
        same = f"atol = rtol = {_short_float(atol)}" if atol == rtol else \
            f"atol = {_short_float(atol)}, rtol = {_short_float(rtol)}"
        pairs.append((dtype, same))
    return tuple(pairs)


def _short_float(value: float) -> str:
    """1e-4, 2e-2, 0.5: the way a person writes a tolerance."""
    mantissa, _, exponent = f"{value:.0e}".partition("e")
    text = f"{mantissa}e{int(exponent)}"
    return text if float(text) == value else f"{value:g}"


def parse_directions(text: str, count: int) -> list[str]:
    """Up to `count` distinct directions from a `directions` reply: its numbered or bulleted lines
    outside code blocks, markdown emphasis removed, each shortened like an idea."""

    found: list[str] = []
    for line in prose_lines(text):
        match = _LIST_ITEM.match(line.replace("**", ""))
        if match:
            item = shorten_idea(match.group("text"))
            if item.lower() not in (f.lower() for f in found):
                found.append(item)
    return found[:count]


def trace_context(trace: TaskTrace) -> dict[str, Any]:
    """What the templates show of a trace."""
    workload = trace.workload_class if trace.workload_class in WORKLOAD_CLASSES else "other"
    return {
        "workload_class": workload,
        "aten_ops": list(trace.aten_ops),
        "flops": trace.flops,
        "min_bytes": trace.min_bytes,
        "output_dtypes": list(trace.output_dtypes),
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
        parts.append(f"{verdict.sol_fraction:.1%} of the reference algorithm's work bound")
    return ", ".join(parts) + "." if parts else "not timed."
