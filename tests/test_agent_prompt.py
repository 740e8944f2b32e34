"""Prompt templates: every stage renders, strictly, with what the agent passes."""

from __future__ import annotations

import jinja2
import pytest

from cutegen import prompt
from cutegen.knowledge import select_knowledge
from cutegen.records import WORKLOAD_CLASSES, TaskTrace, TimingStats, Verdict

TRACE = TaskTrace(aten_ops=("sigmoid", "mul"), flops=0, input_bytes=4096, param_bytes=0, output_bytes=4096,
                  workload_class="elementwise", anchor_op="sigmoid")
COMMON = dict(task_id="swish_scale", reference_source="class Model: ...", knowledge="", note=None,
              **prompt.trace_context(TRACE))
PASSED = Verdict(task_id="swish_scale", candidate_sha256="c", track="fp32", backend="cute", passed=True,
                 stage="timing", failure=None, feedback="", timing=TimingStats(0.25, 0.26, 0.24, 0.01, 100),
                 speedup_vs_eager=1.5, speedup_vs_compile=1.1, sol_fraction=0.42)


def optimize_context(**over):
    context = dict(COMMON, best_source="class ModelNew: ...", measurements=prompt.measurements(PASSED), round=1,
                   rounds=5, history=[], profile_due=False, profile_text=None, rank=1, direction=None, in_flight=[])
    context.update(over)
    return context


def test_generate_carries_task_trace_and_contract():
    system, user = prompt.messages("generate", backend="cute", track="fp32", **COMMON)
    assert system.role == "system" and "sm_90a" in system.content and "1e-4" in system.content
    assert user.role == "user"
    for needle in ("swish_scale", "class Model: ...", "**elementwise**", "8,192 bytes", "CuteKernel",
                   'extern "C" int', "cudaStream_t stream"):
        assert needle in user.content, needle
    torch_user = prompt.messages("generate", backend="torch", track="tf32", **COMMON)[1].content
    assert "CuteKernel" not in torch_user and "any PyTorch operation" in torch_user


def test_missing_variables_raise():
    with pytest.raises(jinja2.UndefinedError):
        prompt.messages("repair_build", backend="cute", track="fp32", **COMMON)


def test_repair_prompts_show_candidate_and_feedback():
    context = dict(COMMON, candidate_source="BROKEN", feedback="error: no member named 'foo'", failure="nvcc",
                   failed_stage="build", attempt=2, max_attempts=3, note="the reply had no code block",
                   pitfalls="")
    user = prompt.messages("repair_build", backend="cute", track="fp32", **context)[1].content
    assert "BROKEN" in user and "no member named 'foo'" in user and "attempt 2 of 3" in user
    assert "the reply had no code block" in user and "Known causes" not in user
    shown = prompt.messages("repair_build", backend="cute", track="fp32",
                            **dict(context, pitfalls="Add the missing include."))[1].content
    assert "Known causes of this error:\n\nAdd the missing include." in shown
    context["failed_stage"] = "correctness"
    user = prompt.messages("repair_correctness", backend="cute", track="fp32", **context)[1].content
    assert "`correctness` stage" in user and "by `nvcc`" in user


def test_repair_stage_follows_the_failing_stage():
    assert prompt.repair_stage(Verdict(**{**PASSED.__dict__, "passed": False, "stage": "build"})) == "repair_build"
    for stage in ("static", "correctness", "anticheat", "timing"):
        failed = Verdict(**{**PASSED.__dict__, "passed": False, "stage": stage})
        assert prompt.repair_stage(failed) == "repair_correctness"


@pytest.mark.parametrize("workload", WORKLOAD_CLASSES)
def test_optimize_has_guidance_for_every_workload_class(workload):
    context = optimize_context(workload_class=workload)
    user = prompt.messages("optimize", backend="cute", track="fp32", **context)[1].content
    assert f"## Guidance for {workload} workloads" in user
    assert "median 0.25 ms, 1.5x eager PyTorch, 1.1x torch.compile, 42.0% of the reference algorithm's work bound." in user


def test_profile_block_only_when_due():
    absent = prompt.messages("optimize", backend="cute", track="fp32", **optimize_context())[1].content
    assert "Profile of the best kernel" not in absent and "Profile not available" not in absent
    due = optimize_context(profile_due=True)
    unavailable = prompt.messages("optimize", backend="cute", track="fp32", **due)[1].content
    assert "Profile not available" in unavailable
    shown = prompt.messages("optimize", backend="cute", track="fp32",
                            **optimize_context(profile_due=True, profile_text="DRAM throughput 91% of peak"))[1].content
    assert "DRAM throughput 91% of peak" in shown and "Profile not available" not in shown


def test_knowledge_is_picked_by_workload_class(tmp_path):
    (tmp_path / "common.md").write_text("Always vectorise.")
    (tmp_path / "gemm.md").write_text("Use wgmma.")
    assert select_knowledge("gemm", folder=tmp_path) == "Always vectorise.\n\nUse wgmma."
    assert select_knowledge("norm", folder=tmp_path) == "Always vectorise."
    assert select_knowledge("gemm", folder=tmp_path / "absent") == ""
    user = prompt.messages("generate", backend="cute", track="fp32",
                           **dict(COMMON, knowledge=select_knowledge("gemm", folder=tmp_path)))[1].content
    assert "Use wgmma." in user


# ------------------------------------------------------------------------------ the cuda backend

CUTE_WORDS = ("cute::", "<cute/", "CuTe tensors", "TiledMMA", "Copy_Atom", "make_tensor", "local_tile")


def _cuda_and_cute(stage: str, **context) -> tuple[str, str]:
    return tuple("\n".join(m.content for m in prompt.messages(stage, backend=b, track="fp32", **context))
                 for b in ("cuda", "cute"))


def test_cuda_prompts_ask_for_plain_cuda_with_the_runtime_and_brace_initialised_dims():
    repair = dict(COMMON, candidate_source="BROKEN", feedback="error", failure="build_error", failed_stage="build",
                  attempt=1, max_attempts=3, pitfalls="")
    for stage, context in (("generate", COMMON), ("repair_build", repair)):
        cuda, cute = _cuda_and_cute(stage, **context)
        for needle in ("plain CUDA C++", "inline PTX", "CuteKernel", 'extern "C" int', "cudaStream_t stream",
                       "dim3 const grid{", "most vexing parse", "load_inline", "sm_90a",
                       "`forward` may only allocate outputs"):
            assert needle in cuda, (stage, needle)
        assert not any(word in cuda for word in CUTE_WORDS), stage
        assert "do not use CuTe" in cuda and "plain CUDA" not in cute and "using namespace cute;" in cute
        # An ablation changes only the language: the same sections, in the same order.
        headings = [[line for line in text.splitlines() if line.startswith(("# ", "## "))] for text in (cuda, cute)]
        assert headings[0] == headings[1], stage


@pytest.mark.parametrize("workload", WORKLOAD_CLASSES)
def test_cuda_optimize_guidance_names_no_cute_api(workload):
    cuda, cute = _cuda_and_cute("optimize", **optimize_context(workload_class=workload))
    assert f"## Guidance for {workload} workloads" in cuda
    assert not any(word in cuda for word in CUTE_WORDS), workload
    if workload in ("gemm", "elementwise"):  # the guidance that names CuTe's API has a plain-CUDA form
        assert cuda != cute and any(word in cute for word in CUTE_WORDS)


@pytest.mark.parametrize("workload", WORKLOAD_CLASSES)
def test_cuda_knowledge_is_the_plain_cuda_pack(workload):
    cuda = select_knowledge(workload, ("mm", "_softmax", "native_layer_norm", "relu"), dtypes=("float32",),
                            track="fp32", backend="cuda")
    assert cuda.startswith("## Plain CUDA on Hopper in brief") and "__shfl_xor_sync" in cuda
    assert not any(word in cuda for word in CUTE_WORDS) and "CuTe" not in cuda
    cute = select_knowledge(workload, dtypes=("float32",), track="fp32", backend="cute")
    assert cute.startswith("## CuTe in brief")
    assert select_knowledge(workload, backend="torch") == select_knowledge(workload)  # torch prompts as before
