"""KernelBench-format candidates (kernels built with torch.utils.cpp_extension.load_inline): a call on
the module load_inline returns is the candidate's own kernel, even when its function is named like a
tensor method, while calling that name on a tensor is still a PyTorch op."""

from __future__ import annotations

from pathlib import Path

from cutegen.evaluate.checks_static import run_static_checks

REPO = Path(__file__).resolve().parents[1]
RELU = REPO / "bench" / "candidates" / "cuda" / "level_1_problem_19_sample_0_kernel.py"


def test_a_load_inline_modules_relu_is_the_candidates_own_kernel():
    source = RELU.read_text()
    assert "mod.relu(x.contiguous())" in source
    assert run_static_checks(source, backend="torch") == ()
    # Under the CuTe backend the only finding is the missing CuTe: the allow-list accepts the call.
    assert {f.check for f in run_static_checks(source, backend="cute")} == {"check_uses_cute"}


def test_the_same_name_on_a_tensor_is_still_a_pytorch_op():
    source = RELU.read_text().replace("mod.relu(x.contiguous())", "x.contiguous().relu()")
    findings = run_static_checks(source, backend="cute")
    assert "check_forward_allowlist" in {f.check for f in findings}


def test_a_module_loaded_inside_a_helper_is_resolved_too():
    source = '''
import torch
import torch.nn as nn
from torch.utils import cpp_extension


def _build():
    return cpp_extension.load_inline(name="ext", cpp_sources="", cuda_sources="", functions=["sum"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = _build()

    def forward(self, x):
        return self.ext.sum(x)
'''
    assert "check_forward_allowlist" not in {f.check for f in run_static_checks(source, backend="cute")}
