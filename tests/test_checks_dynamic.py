"""Dynamic anti-cheat checks, run on the example tasks with real tensors.

Each dynamic cheat fixture (tests/fixtures/cheats/, header `caught-by: <function>`) is run against its
task's reference on CPU and the named function must catch it, under every backend it applies to
(`backends:`; only the op audit's verdict depends on the backend); fixtures marked `needs: cuda` run in
the `gpu` tests at the end. Every honest fixture must pass every dynamic check (no false positives).
"""

from __future__ import annotations

import importlib.util
import shutil
import threading
from pathlib import Path

import pytest
import torch

from cutegen.evaluate.checks_dynamic import (
    OpAudit,
    audit_kernels,
    check_nonfinite,
    check_output_types,
    churn_free_memory,
    classify_kernel,
    disallowed_ops,
    ghost_probe,
    global_state_changes,
    inputs_mutated,
    new_threads,
    snapshot_global_state,
    thread_snapshot,
)
from cutegen.evaluate.compare import compare_outputs
from cutegen.evaluate.confine import landlock_abi
from cutegen.tasks import load_task, task_module

from helpers import backends, header, needs_nvcc, task_path

REPO = Path(__file__).resolve().parents[1]
CHEATS = REPO / "tests" / "fixtures" / "cheats"
HONEST = REPO / "tests" / "fixtures" / "honest"
TOL = 1e-4

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def fixtures_caught_by(name: str, *, cuda: bool = False) -> list[Path]:
    found = [p for p in sorted(CHEATS.glob("[0-9][0-9]_*.py")) if header(p).get("caught-by") == name]
    return [p for p in found if (header(p).get("needs") == "cuda") == cuda]


# The load_inline twin (a 25 s C++ build) passes the whole pipeline, and so every dynamic check, in
# tests/test_confine.py wherever the kernel has Landlock and a compiler is there; here only elsewhere.
_CONFINE_JUDGES_IT = landlock_abi() > 0 and bool(shutil.which("c++") and shutil.which("ninja"))
HONEST_TORCH = [p for p in sorted(HONEST.glob("*.py")) if header(p).get("backend") == "torch"
                and not (_CONFINE_JUDGES_IT and "load_inline" in p.read_text())]
HONEST_CUTE = [p for p in sorted(HONEST.glob("*.py")) if header(p).get("backend") == "cute"] + sorted(
    (REPO / "examples" / "candidates").glob("*.py")
)


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"candidate_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setup(path: Path, device: str = "cpu", seed: int = 0):
    """(reference model, candidate model, inputs, task module) with matching weights, as the evaluator
    builds them: same init inputs, same seed before each constructor."""
    task = task_module(load_task(task_path(path, REPO)))
    init = task.get_init_inputs()
    torch.manual_seed(seed)
    reference = task.Model(*init).to(device)
    candidate_module = _load(path)
    torch.manual_seed(seed)
    candidate = candidate_module.ModelNew(*init).to(device)
    torch.manual_seed(seed + 1)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    return reference, candidate, inputs, task


def fresh_inputs(task, seed: int, device: str = "cpu") -> list:
    torch.manual_seed(seed)
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]


def clones(inputs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


# --------------------------------------------------------------------- honest: no false positives


@pytest.mark.parametrize("path", HONEST_TORCH, ids=[p.stem for p in HONEST_TORCH])
def test_honest_candidate_passes_every_dynamic_check(path):
    reference, candidate, inputs, _ = setup(path)
    expected = reference(*clones(inputs))
    before_state, before_threads, kept = snapshot_global_state(), thread_snapshot(), clones(inputs)
    with OpAudit() as audit:
        out = candidate(*inputs)
    assert audit.ops, "the audit records the torch backend's compute ops"
    assert disallowed_ops(audit.ops, "torch") == []
    assert check_output_types(out, expected) == []
    assert check_nonfinite(out, expected) == []
    assert inputs_mutated(kept, inputs) == []
    assert global_state_changes(before_state, snapshot_global_state()) == []
    assert new_threads(before_threads) == []
    stats = compare_outputs(out, expected, TOL, TOL)
    assert stats.mismatched_elements == 0, stats
    assert ghost_probe(candidate, reference, inputs, tol=TOL) is None


# ----------------------------------------------------------------------------- cheats: caught


# What each op-audit fixture computes with, as the op audit names it.
AUDITED_COMPUTE = {
    "08_python_operators": ["aten.neg.default", "aten.pow.Scalar", "aten.add.Tensor", "aten.div.Tensor",
                            "aten.mul.Tensor"],
    "09_operator_module": ["aten.mm.default"],
}


def test_every_op_audit_fixture_has_its_expected_ops():
    assert sorted(AUDITED_COMPUTE) == [p.stem for p in fixtures_caught_by("disallowed_ops")]


@pytest.mark.parametrize("path", fixtures_caught_by("disallowed_ops"), ids=lambda p: p.stem)
def test_op_audit_catches_compute_the_ast_cannot_see(path):
    """On CPU tensors forward skips its CuTe copy (it takes CUDA tensors only); the torch compute
    before it is what the audit flags, and its answer is right, so on the GPU nothing before the op
    audit (correctness, determinism) rejects the candidate."""
    reference, candidate, inputs, _ = setup(path)
    with OpAudit() as audit:
        out = candidate(*clones(inputs))
    assert backends(path) == ("cute", "cuda")
    for backend in backends(path):
        assert disallowed_ops(audit.ops, backend) == AUDITED_COMPUTE[path.stem], backend
    assert disallowed_ops(audit.ops, "torch") == []
    assert compare_outputs(out, reference(*clones(inputs)), TOL, TOL).mismatched_elements == 0


RUNNABLE_STATIC_COMPUTE = [
    CHEATS / name
    for name in ("01_torch_matmul.py", "02_functional_gelu.py", "03_tensor_method_sum.py",
                 "04_getattr_matmul.py", "05_helper_indirect.py", "06_calls_reference_model.py",
                 "07_nn_module_call.py", "10_subclass_model.py")
]


@pytest.mark.parametrize("path", RUNNABLE_STATIC_COMPUTE, ids=lambda p: p.stem)
def test_op_audit_also_catches_the_statically_caught_compute(path):
    _, candidate, inputs, _ = setup(path)
    with OpAudit() as audit:
        candidate(*inputs)
    assert {"cute", "cuda"} <= set(backends(path))
    for backend in backends(path):
        assert bool(disallowed_ops(audit.ops, backend)) == (backend != "torch"), backend


def test_the_dynamic_checks_say_where_they_apply():
    """The op and kernel audits enforce the candidate's own kernels (cute, cuda); the ghost probe
    applies to every backend; the op audit's rule is the same for cute and cuda."""
    from cutegen.errors import ConfigError
    from cutegen.evaluate.anticheat import DYNAMIC_CHECK_BACKENDS, applies

    for check in ("disallowed_ops", "audit_kernels"):
        assert [b for b in ("cute", "cuda", "torch") if applies(check, b)] == ["cute", "cuda"]
    assert all(applies("ghost_probe", b) for b in ("cute", "cuda", "torch"))
    assert set(DYNAMIC_CHECK_BACKENDS) <= {"disallowed_ops", "audit_kernels", "ghost_probe"}
    ops = ["aten.empty.memory_format", "aten.mm.default", "aten.view.default", "mylib.relu.default"]
    assert disallowed_ops(ops, "cuda") == disallowed_ops(ops, "cute") == ["aten.mm.default", "mylib.relu.default"]
    with pytest.raises(ConfigError, match="backend"):
        disallowed_ops(ops, "triton")


def test_op_audit_allows_allocation_views_and_layout_copies():
    x = torch.randn(8, 6)
    with OpAudit() as audit:
        out = torch.empty_like(x)
        torch.zeros(3).fill_(1.0)
        x.new_zeros(4).zero_()
        x.t().contiguous().view(-1)
        x[1:].reshape(-1, 2).unsqueeze(0).expand(2, -1, -1).permute(1, 0, 2)
        torch.empty_strided((2, 2), (1, 2))
        x.chunk(2)
        out.new_empty(3)
    assert len(audit.ops) >= 10
    assert disallowed_ops(audit.ops, "cute") == []


def test_op_audit_names_the_compute_ops():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with OpAudit() as audit:
        torch.matmul(a, b)
        (a * 2).sum()
        torch.nn.functional.relu(a)
        a.to(torch.float64)
    flagged = disallowed_ops(audit.ops, "cute")
    assert flagged == ["aten.mm.default", "aten.mul.Tensor", "aten.sum.default", "aten.relu.default",
                       "aten._to_copy.default"]


@pytest.mark.parametrize("path", fixtures_caught_by("check_output_types"), ids=lambda p: p.stem)
def test_output_types_catches(path):
    reference, candidate, inputs, _ = setup(path)
    problems = check_output_types(candidate(*clones(inputs)), reference(*clones(inputs)))
    assert problems


def test_output_types_messages():
    ref = torch.zeros(2, 3)
    assert check_output_types(torch.zeros(2, 3), ref) == []
    assert check_output_types(torch.nn.Parameter(torch.zeros(2, 3)), ref)[0].startswith("output: a torch.nn")
    assert check_output_types(torch.zeros(3, 2), ref) == ["output: shape torch.Size([3, 2]), expected torch.Size([2, 3])"]
    assert check_output_types((torch.zeros(2, 3),), ref) == ["output: a tuple, expected a torch.Tensor"]
    assert check_output_types(torch.zeros(2, 3), (ref, ref)) == ["output: a Tensor, expected a sequence of 2 items"]
    assert check_output_types([torch.zeros(2, 3, dtype=torch.float64)], (ref,)) == [
        "output[0]: dtype torch.float64, expected torch.float32"
    ]


@pytest.mark.parametrize("path", fixtures_caught_by("check_nonfinite"), ids=lambda p: p.stem)
def test_nonfinite_catches_on_heavy_tailed_inputs(path):
    reference, candidate, inputs, _ = setup(path)
    assert check_nonfinite(candidate(*clones(inputs)), reference(*clones(inputs))) == []  # randn: fine
    heavy = [x * 50.0 for x in inputs]  # the adversarial distribution: large outliers
    expected = reference(*clones(heavy))
    assert torch.isfinite(expected).all()
    problems = check_nonfinite(candidate(*clones(heavy)), expected)
    assert problems and "NaN/Inf" in problems[0]


def test_nonfinite_ignores_nan_the_reference_has_too():
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    assert check_nonfinite(torch.tensor([1.0, float("nan"), float("inf")]), ref) == []
    assert check_nonfinite(torch.tensor([float("inf"), 0.0, 0.0]), ref) == [
        "output[0]: 1 NaN/Inf elements where the reference is finite (first at (0,))"
    ]


def test_nonfinite_counts_a_chunk_at_a_time_with_the_same_answer(monkeypatch):
    """Gigabyte outputs are counted in chunks (a whole mask summed as int64 took 12 GiB on the H200):
    the count and the first element are those of the whole tensor, across chunk edges and strides."""
    from cutegen.evaluate import checks_dynamic

    monkeypatch.setattr(checks_dynamic, "CHUNK_ELEMENTS", 7)
    out, ref = torch.zeros(5, 6), torch.zeros(5, 6)
    out[2, 3], out[3, 0], out[4, 5], ref[4, 5] = float("nan"), float("-inf"), float("inf"), float("inf")
    assert check_nonfinite(out, ref) == ["output[0]: 2 NaN/Inf elements where the reference is finite (first at (2, 3))"]
    assert check_nonfinite(out.t(), ref.t()) == [
        "output[0]: 2 NaN/Inf elements where the reference is finite (first at (0, 3))"]


@pytest.mark.parametrize("path", fixtures_caught_by("inputs_mutated"), ids=lambda p: p.stem)
def test_inputs_mutated_catches(path):
    _, candidate, inputs, _ = setup(path)
    kept = clones(inputs)
    candidate(*inputs)
    assert inputs_mutated(kept, inputs) == [0]


def test_inputs_mutated_compares_values_nan_and_metadata():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert inputs_mutated([a.clone(), 4], [a, 4]) == []
    assert inputs_mutated([a.clone(), 4], [a, 5]) == [1]
    assert inputs_mutated([a.clone()], [torch.tensor([1.0, 2.0, 3.0])]) == [0]
    square = torch.zeros(2, 2)
    assert inputs_mutated([square.clone()], [square.t()]) == [0]  # same values, other strides


@pytest.mark.parametrize("path", fixtures_caught_by("ghost_probe"), ids=lambda p: p.stem)
def test_ghost_probe_catches(path):
    """The ghost's answer is right on the task's inputs, the heavy-tailed ones included (so the
    correctness trials pass it), and only the perturbed input shows it ignores its argument."""
    from cutegen.evaluate.correctness import ADVERSARIAL_LADDER, make_inputs

    reference, candidate, inputs, task = setup(path)
    for seed, adversarial in ((11, None), (12, ADVERSARIAL_LADDER[0])):
        drawn = make_inputs(task, seed, adversarial)
        got, expected = candidate(*clones(drawn)), reference(*clones(drawn))
        assert compare_outputs(got, expected, TOL, TOL).mismatched_elements == 0
    reason = ghost_probe(candidate, reference, inputs, tol=TOL)
    assert reason is not None and "does not depend on its inputs" in reason
    assert ghost_probe(reference, reference, inputs, tol=TOL) is None  # the honest answer follows


def test_ghost_probe_catches_an_ignored_second_input():
    reference = lambda a, b: a @ b  # noqa: E731
    half_ghost = lambda a, b: a @ torch.ones_like(b)  # noqa: E731 - ignores b
    inputs = [torch.randn(6, 5), torch.randn(5, 4)]
    assert ghost_probe(reference, reference, inputs) is None
    assert "input 1" in ghost_probe(half_ghost, reference, inputs)


def test_ghost_probe_moves_only_non_zero_elements_so_skipping_a_stated_structure_passes():
    """KernelBench level1/14's shape of task: upper-triangular inputs. A kernel that never reads the
    lower halves (zero in every draw of the task) is honest; moving a zero there would give an input
    the task never draws. A kernel that ignores inputs the task does draw is still caught."""
    reference = lambda a, b: torch.triu(a @ b)  # noqa: E731
    skips_zeros = lambda a, b: torch.triu(torch.triu(a) @ torch.triu(b))  # noqa: E731 - reads the upper halves only
    inputs = [torch.triu(torch.rand(24, 24)), torch.triu(torch.rand(24, 24))]
    precomputed = reference(*inputs)
    ghost = lambda a, b: precomputed.clone()  # noqa: E731
    for _ in range(40):  # random positions: with zeros moved, about 3 in 4 of these probes would fail
        assert ghost_probe(skips_zeros, reference, inputs) is None
        assert "does not depend on its inputs" in ghost_probe(ghost, reference, inputs)


def test_a_non_zero_position_is_found_in_a_mostly_zero_input_and_none_in_an_all_zero_one(monkeypatch):
    from cutegen.evaluate import checks_dynamic

    monkeypatch.setattr(checks_dynamic, "CHUNK_ELEMENTS", 1000)  # several chunks, searched from a random one
    flat = torch.zeros(10_000)
    flat[7321] = 0.5
    assert {checks_dynamic.nonzero_position(flat) for _ in range(20)} == {7321}
    flat[7321] = float("nan")  # NaN is not zero
    assert checks_dynamic.nonzero_position(flat) == 7321
    assert checks_dynamic.nonzero_position(torch.zeros(5000)) is None
    plan = checks_dynamic.ghost_perturbations([torch.zeros(3, 3), torch.ones(2, 2)])
    assert [index for index, _, _ in plan] == [1]  # nothing to move in an all-zero input


def test_ghost_probe_is_silent_when_the_reference_ignores_its_input():
    constant = lambda x: torch.zeros(3)  # noqa: E731
    assert ghost_probe(constant, constant, [torch.randn(3)]) is None


@pytest.mark.parametrize("path", fixtures_caught_by("global_state_changes"), ids=lambda p: p.stem)
def test_global_state_changes_catches(path):
    """The snapshot is taken before the candidate's module is imported, as the evaluator does: a
    flag flipped at import shows up at the first comparison (after the build)."""
    matmul = torch.backends.cuda.matmul
    saved_allow = matmul.allow_tf32
    saved_precision = getattr(matmul, "fp32_precision", None)
    before = snapshot_global_state()
    try:
        reference, candidate, inputs, _ = setup(path)
        changes = global_state_changes(before, snapshot_global_state())
        out = candidate(*clones(inputs))
    finally:
        matmul.allow_tf32 = saved_allow
        if saved_precision is not None:
            matmul.fp32_precision = saved_precision
    assert any("allow_tf32: False -> True" in c for c in changes), changes
    assert global_state_changes(before, snapshot_global_state()) == []
    # on CPU tensors TF32 changes nothing, so only the snapshot can tell
    assert compare_outputs(out, reference(*clones(inputs)), TOL, TOL).mismatched_elements == 0


def test_global_state_changes_sees_replaced_functions():
    import time

    before = snapshot_global_state()
    real = time.perf_counter
    time.perf_counter = lambda: real() / 10.0
    try:
        changes = global_state_changes(before, snapshot_global_state())
    finally:
        time.perf_counter = real
    assert len(changes) == 1 and changes[0].startswith("time.perf_counter: replaced")
    assert global_state_changes(before, snapshot_global_state()) == []


@pytest.mark.parametrize("path", fixtures_caught_by("new_threads"), ids=lambda p: p.stem)
def test_new_threads_catches(path):
    """The early calls' outputs are complete when forward returns (correctness cannot tell), and the
    thread that wrote them is still alive after it."""
    reference, candidate, inputs, _ = setup(path)
    before = thread_snapshot()
    out = candidate(*clones(inputs))
    found = new_threads(before)
    stats = compare_outputs(out, reference(*clones(inputs)), TOL, TOL)
    for thread in threading.enumerate():
        if thread.ident not in before:
            thread.join(timeout=10)  # the fixture's worker ends after a few idle seconds
    assert found and "late-finisher" in found[0]
    assert stats.mismatched_elements == 0
    assert new_threads(before) == []


# The compare_outputs fixtures that are right on their first call (the others are wrong from the start).
STALE_RESULT_CHEATS = [CHEATS / "35_cached_results.py", CHEATS / "36_first_call_only.py"]


def test_the_stale_result_cheats_are_compare_outputs_fixtures():
    assert set(STALE_RESULT_CHEATS) <= set(fixtures_caught_by("compare_outputs"))


@pytest.mark.parametrize("path", STALE_RESULT_CHEATS, ids=lambda p: p.stem)
def test_timed_call_validation_catches_stale_results(path):
    """Right on the first (correctness) call; wrong on a later call with fresh inputs, which is what
    checking randomly chosen timed calls against the reference catches."""
    reference, candidate, inputs, task = setup(path)
    first = compare_outputs(candidate(*clones(inputs)), reference(*clones(inputs)), TOL, TOL)
    assert first.mismatched_elements == 0
    later = fresh_inputs(task, seed=1234)
    stats = compare_outputs(candidate(*clones(later)), reference(*clones(later)), TOL, TOL)
    assert stats.mismatched_elements > 0


def test_lower_precision_inside_a_candidate_is_not_forgiven_as_the_references_rounding():
    """The float64-aware comparison forgives the reference's own rounding error; a candidate rounding
    its operands to TF32 is still wrong on most elements."""
    from cutegen.evaluate.correctness import exact_delta, exact_model, rounding_slack

    reference, candidate, inputs, _ = setup(CHEATS / "39_tf32_inside.py")
    with torch.no_grad():
        ref = reference(*clones(inputs))
        delta, note = exact_delta(exact_model(reference), clones(inputs), ref, torch.device("cpu"))
        stats = compare_outputs(candidate(*clones(inputs)), ref, TOL, TOL, ref_delta=delta)
    assert note is None and delta is not None
    assert stats.mismatched_elements > stats.total_elements // 2
    # Nor within the reference's rounding drawn again (the slack the reference process uses where few
    # elements fail): TF32 is 2^13 times coarser than fp32.
    with torch.no_grad():
        slack, note = rounding_slack(reference, exact_model(reference), clones(inputs), ref, delta,
                                     torch.device("cpu"), seed=7)
        stats = compare_outputs(candidate(*clones(inputs)), ref, TOL, TOL, ref_delta=delta, ref_slack=slack)
    assert note is None and stats.mismatched_elements > stats.total_elements // 2


def test_cpu_only_fallbacks():
    assert churn_free_memory("cpu") == 0  # nothing given back to a driver
    if not torch.cuda.is_available():
        result = audit_kernels(lambda x: x * 2, [torch.ones(2)])
        assert result["kernels"] == [] and "no CUDA" in result["skipped"]


def test_a_profile_with_no_device_event_is_told_apart_by_the_judges_canary(monkeypatch):
    """CUPTI can fail to start (CUPTI_ERROR_NOT_INITIALIZED: an honest candidate was once rejected for
    "none of its own kernels ran"). An empty profile is followed by the judge's canary profiled alone:
    seen, the forward is profiled again and that profile counts, so a forward that launches nothing
    still fails; not seen although it ran, the audit is blind (the parent's infrastructure verdict),
    never "own kernels"; a canary that did not run (a candidate in its way) leaves the empty profile."""
    from cutegen.evaluate import checks_dynamic

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(checks_dynamic, "_CANARY_ZEROS", lambda *a, **k: torch.zeros(1))  # no device here
    forward = lambda x: x  # noqa: E731
    for profiles, own, blind, canary_runs in (
        ([["my_kernel"]], ["my_kernel"], False, True),  # seen at once: no canary
        ([[], ["vectorized_elementwise_kernel"], ["my_kernel"]], ["my_kernel"], False, True),  # CUPTI late
        ([[], ["vectorized_elementwise_kernel"], []], [], False, True),  # the forward launches nothing
        ([[], []], [], True, True),  # the profiler sees nothing at all
        ([[], []], [], False, False),  # the canary was kept from running: judged on the empty profile
    ):
        left, ran = list(profiles), []

        def profiled(fn, inputs):
            ran.append(fn is forward)
            if fn is forward or canary_runs:
                fn(*inputs)
            return left.pop(0)

        monkeypatch.setattr(checks_dynamic, "_profiled_kernel_names", profiled)
        result = audit_kernels(forward, [torch.ones(2)])
        assert not left and result["own_kernels"] == own and result["library_kernels"] == []
        assert result["blind"] is blind and (result["skipped"] is not None) is blind
        assert ran[0] and all(ran[2:]) and (len(ran) < 2 or not ran[1])  # the forward, the canary, the forward


def test_dispatch_evasion_hides_from_the_op_audit():
    """Why the kernel audit exists: with the dispatch mode popped, the op audit sees no compute,
    although forward computed the right product with torch (aten.mm when the audit can see it)."""
    import operator

    path = CHEATS / "37_dispatch_evasion.py"
    reference, candidate, inputs, _ = setup(path)
    with OpAudit() as audit:
        out = candidate(*inputs)
    assert audit.ops == []
    assert compare_outputs(out, reference(*clones(inputs)), TOL, TOL).mismatched_elements == 0
    with OpAudit() as audit:
        operator.matmul(*inputs)
    assert audit.ops == ["aten.mm.default"]


CUTE_DYNAMIC_CHEATS = [p for p in sorted(CHEATS.glob("[0-9][0-9]_*.py"))
                       if header(p)["backend"] == "cute" and "CuteKernel(" in p.read_text()
                       and header(p)["caught-by"] in ("disallowed_ops", "audit_kernels")]


def test_the_cute_dynamic_cheats_are_found():
    assert [p.name for p in CUTE_DYNAMIC_CHEATS] == ["08_python_operators.py", "09_operator_module.py",
                                                      "37_dispatch_evasion.py"]


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("path", CUTE_DYNAMIC_CHEATS, ids=lambda p: p.stem)
def test_cute_dynamic_cheat_kernels_compile_for_sm90a(path, shared_build_cache):
    """Their dynamic checks come after the build: a kernel that did not compile would stop them at
    the build stage (compile-only, no GPU needed). The fixtures share one copy kernel, so one cache
    builds it once; not at all when its exact inputs built before (tests/compile_record.py)."""
    from compile_record import remember, skip_if_compiled_before
    from cutegen.config import RuntimeConfig
    from cutegen.runtime import find_kernels, library_key

    kernels = find_kernels(_load(path))
    assert [k.name for k in kernels] == ["tile_copy"]
    config = RuntimeConfig(cache_dir=shared_build_cache, arch="sm_90a")
    key = library_key(kernels[0].source, config)
    skip_if_compiled_before(path.name, [key])
    result = kernels[0].build(config)
    assert result.library_path.is_file() and result.arch == "sm_90a" and result.cache_key == key
    remember(path.name, [key])


@pytest.mark.parametrize(
    "name, kind",
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "prep"),
        ("Memcpy DtoD (Device -> Device)", "prep"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "library"),
        ("nvjet_tst_128x64_64x8_2x1_v_bz_NNT", "library"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)", "library"),
        ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemvParamsEx<int, float>>", "library"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "library"),
        ("triton_poi_fused_mul_sigmoid_0", "library"),
        ("void swish_scale_kernel<1024, 4>(float const*, float*, int, float)", "own"),
        ("void gemm_device<cute::Layout<cute::tuple<int, int>>>(float*)", "own"),
        # The profiler's name of examples/candidates/gemm_bf16_wgmma.py's kernel on the H200 (cut short):
        # CuTe's SM90 TMA and GMMA types in its template arguments are not vendor kernels.
        ("void gemm_bf16_impl::gemm_bf16_kernel<gemm_bf16_impl::Config<(cute::SM90::GMMA::Major)1>, 0, "
         "cute::Copy_Atom<cute::Copy_Traits<cute::SM90_TMA_LOAD, cute::C<131072>, cute::AuxTmaParams<cute::tuple<"
         "cute::ScaledBasis<cute::C<1>, 1>, cute::ScaledBasis<cute::C<1>, 0> >, cute::Layout<cute::tuple<cute::C<64>,"
         " cute::C<128> >, cute::tuple<cute::ScaledBasis<cute::C<1>, 1>, cute::ScaledBasis<cute::C<1>, 0> > > const&,"
         " cute::Swizzle<3, 4, 3> const&> >, cutlass::bfloat16_t> >(cutlass::bfloat16_t*, int, int, int)", "own"),
        ("void mine::k<cutlass::arch::Sm90, cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>>(float*)", "own"),
        ("void cutlass::device_kernel<cutlass3x_sm90_tensorop_gemm_bf16_128x256x64_warpspecialized>(Params)",
         "library"),
        ("void c10::cuda::detail::some_kernel<float>(float*)", "library"),
    ],
)
def test_kernel_names_are_classified(name, kind):
    assert classify_kernel(name) == kind


# ------------------------------------------------------------------------------------------ GPU


@gpu
@needs_cuda
@pytest.mark.parametrize("path", fixtures_caught_by("churn_free_memory", cuda=True), ids=lambda p: p.stem)
def test_memory_churn_exposes_stale_reference_output(path):
    reference, candidate, inputs, _ = setup(path, device="cuda")
    out = reference(*clones(inputs))
    expected = out.clone()
    del out  # its block goes back to the caching allocator, still holding the answer
    churn_free_memory("cuda")
    got = candidate(*clones(inputs))
    assert compare_outputs(got, expected, TOL, TOL).mismatched_elements > 0
    assert check_nonfinite(got, expected)


def _audited_cuda_call(path: Path, build_cache: Path):
    """A cute-backend fixture on CUDA: (its output's errors against the reference, the disallowed ops
    the op audit saw in a second call, the kernel audit of a third). The op audit's verdict is the
    same under each backend the fixture applies to (cute, cuda)."""
    from cutegen.config import RuntimeConfig
    from cutegen.runtime import use_config

    reference, candidate, inputs, _ = setup(path, device="cuda")
    with use_config(RuntimeConfig(cache_dir=build_cache)):
        out = candidate(*clones(inputs))  # the first call builds the copy kernel
        with OpAudit() as audit:
            candidate(*inputs)
        kernels = audit_kernels(candidate, inputs)
    verdicts = {disallowed_ops(audit.ops, backend) == disallowed_ops(audit.ops, "cute") for backend in backends(path)}
    assert verdicts == {True}
    return compare_outputs(out, reference(*clones(inputs)), TOL, TOL), disallowed_ops(audit.ops, "cute"), kernels


@gpu
@needs_cuda
@pytest.mark.parametrize("path", fixtures_caught_by("audit_kernels", cuda=True), ids=lambda p: p.stem)
def test_kernel_audit_sees_library_kernels_behind_a_disabled_op_audit(path, shared_build_cache):
    stats, ops, result = _audited_cuda_call(path, shared_build_cache)
    assert stats.mismatched_elements == 0
    assert ops == []  # the evasion works on the op audit...
    assert result["skipped"] is None
    assert result["library_kernels"], result  # ...but not on the profiler
    assert any("tile_copy" in k for k in result["own_kernels"]), result  # its own kernel ran too


@gpu
@needs_cuda
@pytest.mark.parametrize("path", fixtures_caught_by("disallowed_ops"), ids=lambda p: p.stem)
def test_op_audit_catches_compute_next_to_an_own_cute_kernel_on_cuda(path, shared_build_cache):
    """On CUDA tensors the fixture launches its CuTe copy; the op audit still names the torch
    compute before it, and the answer is right."""
    stats, ops, kernels = _audited_cuda_call(path, shared_build_cache)
    assert stats.mismatched_elements == 0
    assert ops == AUDITED_COMPUTE[path.stem]
    assert any("tile_copy" in k for k in kernels["own_kernels"]), kernels


@gpu
@needs_cuda
def test_kernel_audit_counts_fills_and_copies_as_prep():
    x = torch.randn(64, 32, device="cuda")

    def prep_only(t):
        out = torch.zeros(t.shape[1], t.shape[0], device=t.device)
        out.copy_(t.t())
        return t.t().contiguous()

    result = audit_kernels(prep_only, [x])
    assert result["prep_kernels"] and result["library_kernels"] == [] and result["own_kernels"] == []


@gpu
@needs_cuda
def test_a_forward_that_launches_nothing_is_audited_as_such_the_canary_kept_out():
    """On a working profiler an empty profile brings the canary (seen) and a second profile (empty
    again): no kernel at all, nothing skipped, and the canary's own kernel in no list."""
    x = torch.randn(64, 32, device="cuda")
    result = audit_kernels(lambda t: t, [x])
    assert result["skipped"] is None and result["kernels"] == [] and result["own_kernels"] == []


@gpu
@needs_cuda
def test_kernel_audit_finds_an_own_triton_kernel():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)

    def run(x):
        y = torch.empty_like(x)
        double_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
        return y

    x = torch.randn(1000, device="cuda")
    run(x)  # compile outside the profiled call
    result = audit_kernels(run, [x])
    assert any("double_kernel" in k for k in result["own_kernels"]), result
    assert result["library_kernels"] == []


@gpu
@needs_cuda
@pytest.mark.parametrize("path", HONEST_TORCH, ids=[p.stem for p in HONEST_TORCH])
def test_honest_candidate_passes_dynamic_checks_on_cuda(path):
    reference, candidate, inputs, _ = setup(path, device="cuda")
    expected = reference(*clones(inputs))
    before, kept = snapshot_global_state(), clones(inputs)
    churn_free_memory("cuda")
    out = candidate(*inputs)
    assert check_output_types(out, expected) == []
    assert check_nonfinite(out, expected) == []
    assert inputs_mutated(kept, inputs) == []
    assert global_state_changes(before, snapshot_global_state()) == []
    assert ghost_probe(candidate, reference, inputs, tol=1e-2) is None
    assert audit_kernels(candidate, inputs)["library_kernels"]  # torch backend: library kernels run


@gpu
@needs_cuda
@pytest.mark.parametrize("path", HONEST_CUTE, ids=[p.stem for p in HONEST_CUTE])
def test_honest_cute_candidate_passes_op_and_kernel_audit(path, tmp_path):
    """No false positive on real CuTe kernels: own kernels seen, no library kernel, no torch compute."""
    from cutegen.config import RuntimeConfig
    from cutegen.errors import ToolchainError
    from cutegen.runtime import use_config

    reference, candidate, inputs, _ = setup(path, device="cuda")
    with use_config(RuntimeConfig(cache_dir=tmp_path)):
        expected = reference(*clones(inputs))
        try:
            out = candidate(*clones(inputs))  # the first call builds the kernel
        except ToolchainError as err:
            pytest.skip(f"cannot build CuTe sources here: {err}")
        with OpAudit() as audit:
            candidate(*inputs)
        kernels = audit_kernels(candidate, inputs)
        ghost = ghost_probe(candidate, reference, inputs, tol=TOL)
    assert compare_outputs(out, expected, TOL, TOL).mismatched_elements == 0
    assert disallowed_ops(audit.ops, "cute") == [], audit.ops
    assert kernels["own_kernels"] and kernels["library_kernels"] == [], kernels
    assert ghost is None
