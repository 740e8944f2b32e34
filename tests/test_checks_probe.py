"""The tolerance comparison (compare.py) against hand-computed numbers, and the trivial-solution probe."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from cutegen.evaluate.compare import compare_outputs, first_mismatches
from cutegen.evaluate.probe import trivial_mismatch_fractions, trivial_solution_probe

# ------------------------------------------------------------------------------------ compare


def test_compare_outputs_hand_computed():
    out = torch.tensor([1.0, 2.0, 3.5])
    ref = torch.tensor([1.0, 2.5, 3.0])
    stats = compare_outputs(out, ref, atol=0.1, rtol=0.1)
    # |diff| = [0, 0.5, 0.5]; allowed = 0.1 + 0.1 * |ref| = [0.2, 0.35, 0.4]: two mismatches.
    assert stats.mismatched_elements == 2 and stats.total_elements == 3
    assert stats.max_abs_error == pytest.approx(0.5)
    assert stats.max_rel_error == pytest.approx(0.2)  # 0.5 / 2.5
    assert stats.rel_l2_error == pytest.approx(math.sqrt(0.5 / 16.25))  # ||diff|| / ||ref||
    assert (stats.atol, stats.rtol) == (0.1, 0.1)


def test_compare_outputs_boundary_is_inclusive():
    ref = torch.tensor([2.0], dtype=torch.float64)
    at_bound = compare_outputs(torch.tensor([2.5], dtype=torch.float64), ref, atol=0.25, rtol=0.125)
    assert at_bound.mismatched_elements == 0  # |0.5| <= 0.25 + 0.125 * 2
    over = compare_outputs(torch.tensor([2.5000001], dtype=torch.float64), ref, atol=0.25, rtol=0.125)
    assert over.mismatched_elements == 1


def test_compare_outputs_over_tuples_adds_up():
    out = (torch.tensor([1.0, 1.0]), torch.tensor([[0.0, 4.0]]))
    ref = (torch.tensor([1.0, 1.0]), torch.tensor([[0.0, 2.0]]))
    stats = compare_outputs(out, ref, atol=0.0, rtol=0.5)
    assert stats.total_elements == 4 and stats.mismatched_elements == 1
    assert stats.max_abs_error == pytest.approx(2.0) and stats.max_rel_error == pytest.approx(1.0)
    assert stats.rel_l2_error == pytest.approx(2.0 / math.sqrt(6.0))


def test_compare_outputs_zero_reference():
    stats = compare_outputs(torch.tensor([0.05, 0.0]), torch.tensor([0.0, 0.0]), atol=0.1, rtol=0.0)
    assert stats.mismatched_elements == 0
    assert stats.max_rel_error == 0.0  # relative error is taken where the reference is non-zero
    assert stats.rel_l2_error == math.inf  # the reference's norm is 0 but the output differs
    assert compare_outputs(torch.zeros(3), torch.zeros(3), 0.0, 0.0).rel_l2_error == 0.0


def test_compare_outputs_nan_and_inf():
    nan, inf = float("nan"), float("inf")
    same = compare_outputs(torch.tensor([nan, inf, -inf]), torch.tensor([nan, inf, -inf]), 1e-4, 1e-4)
    assert same.mismatched_elements == 0 and same.max_abs_error == 0.0
    wrong = compare_outputs(torch.tensor([nan, 5.0, 1.0]), torch.tensor([1.0, inf, 1.0]), 1e-4, 1e-4)
    assert wrong.mismatched_elements == 2 and wrong.max_abs_error == math.inf


def test_compare_outputs_shape_or_structure_mismatch_fails_everything():
    ref = torch.zeros(2, 3)
    assert compare_outputs(torch.zeros(3, 2), ref, 1.0, 1.0).mismatched_elements == 6
    assert compare_outputs(torch.zeros(6), ref, 1.0, 1.0).max_abs_error == math.inf  # no broadcasting
    assert compare_outputs((ref, ref), ref, 1.0, 1.0).mismatched_elements == 6


def test_compare_outputs_accumulates_in_float64():
    ref = torch.full((4,), 1.0, dtype=torch.float16)
    out = torch.full((4,), 1.0009765625, dtype=torch.float16)  # 1 + 2**-10, exact in fp16
    stats = compare_outputs(out, ref, 0.0, 0.0)
    assert stats.max_abs_error == 2.0**-10 and stats.rel_l2_error == pytest.approx(2.0**-10)


def test_first_mismatches_names_positions_and_values():
    out = torch.tensor([[1.0, 2.0], [3.0, 9.0]])
    ref = torch.tensor([[1.0, 2.0], [3.5, 4.0]])
    assert first_mismatches(out, ref, 0.1, 0.0) == (
        "output[0] at (1, 0): got 3, expected 3.5",
        "output[0] at (1, 1): got 9, expected 4",
    )
    assert first_mismatches(out, ref, 0.1, 0.0, limit=1) == ("output[0] at (1, 0): got 3, expected 3.5",)
    assert first_mismatches(torch.zeros(2), torch.zeros(3), 0.1, 0.0) == ("output[0]: shape (2,), expected (3,)",)


# -------------------------------------------------------------------------------------- probe


def test_probe_flags_zeros_for_an_all_zero_reference():
    ref = torch.zeros(64, 32)
    names = trivial_solution_probe([ref], [torch.randn(64, 32)], 1e-4, 1e-4)
    assert "zeros" in names and "constant" in names


def test_probe_finds_nothing_on_a_random_reference():
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    assert trivial_solution_probe([torch.randn(64, 32)], [x], 1e-4, 1e-4) == ()
    assert trivial_solution_probe(torch.relu(x) * 3 + 1, [x], 1e-2, 1e-2) == ()


def test_probe_finds_a_constant_and_a_nearly_constant_reference():
    assert trivial_solution_probe(torch.full((10,), 3.0), [], 1e-4, 1e-4) == ("constant",)
    torch.manual_seed(1)
    nearly = 5.0 + 1e-6 * torch.randn(1000)
    assert trivial_solution_probe([nearly], [], 1e-4, 1e-4) == ("constant",)
    assert trivial_solution_probe([nearly], [], 1e-8, 1e-8) == ()


def test_probe_finds_an_input_copy_of_the_right_shape_only():
    x, other = torch.randn(8, 4), torch.randn(4, 8)
    assert trivial_solution_probe([x.clone()], [other, x, 3], 1e-4, 1e-4) == ("input_copy:1",)


def test_probe_needs_every_output_to_pass():
    zeros, noise = torch.zeros(5), torch.randn(5) + 10
    assert trivial_solution_probe((zeros, zeros), [], 1e-4, 1e-4)[0] == "zeros"
    assert "zeros" not in trivial_solution_probe((zeros, noise), [], 1e-4, 1e-4)


def test_probe_counts_the_elements_a_trivial_answer_gets_wrong():
    # A softmax-like output: tiny everywhere but at 3 of 10000 elements, which zeros fail at 1e-2.
    ref = torch.full((100, 100), 1e-4)
    ref[0, :3] = 0.5
    fractions = trivial_mismatch_fractions([ref], [], 1e-2, 1e-2)
    assert fractions["zeros"] == 3 / 10000 and fractions["constant"] == 3 / 10000
    assert trivial_solution_probe([ref], [], 1e-2, 1e-2) == ()  # not degenerate: 3 elements still tell
    assert trivial_mismatch_fractions([ref], [], 1.0, 0.0) == {"zeros": 0.0, "constant": 0.0}
    assert trivial_mismatch_fractions([ref], [], 1e-5, 0.0)["zeros"] == 1.0


def test_probe_skips_non_tensor_outputs():
    assert trivial_solution_probe([0.0], [], 1e-4, 1e-4) == ()


def _kernelbench() -> Path | None:
    root = os.environ.get("CUTEGEN_KERNELBENCH")
    path = Path(root) if root else Path(__file__).resolve().parents[2] / "shared" / "kernelbench"
    return path if (path / "level1").is_dir() else None


@pytest.mark.kernelbench
@pytest.mark.skipif(_kernelbench() is None, reason="no KernelBench checkout")
def test_probe_on_a_small_kernelbench_task_with_a_known_constant_output():
    """level1/23 (Softmax over 393216 columns) is listed in EVALUATION.md as nearly zero everywhere
    (about 4e-6): zeros pass at KernelBench's 1e-4 tolerance; the same task's inputs are random."""
    from cutegen.tasks import load_task, task_module

    (path,) = sorted((_kernelbench() / "level1").glob("23_*.py"))
    module = task_module(load_task(path, level=1))
    model = module.Model(*module.get_init_inputs())
    torch.manual_seed(0)
    rows = torch.rand(2, module.dim)  # the task's input distribution; two rows suffice (row-wise op)
    with torch.no_grad():
        out = model(rows)
    assert trivial_solution_probe([out], [rows], 1e-4, 1e-4) == ("zeros", "constant")
    assert trivial_solution_probe([out], [rows], 1e-7, 1e-7) == ()
