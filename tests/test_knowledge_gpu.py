"""The knowledge pack's example kernels on a GPU, against PyTorch, on awkward shapes: residue tiles,
both LayerNorm paths, misaligned views, convolution strides/dilations/padding, the bf16 GEMM's two
operand layouts and its fused bias+GELU epilogue. (The evaluator's full protocol and the H200 timings
are in tests/test_knowledge_speed_gpu.py.)

Marked gpu: skipped without a CUDA device.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cutegen.config import RuntimeConfig
from cutegen.runtime import find_kernels, use_config

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CANDIDATES = Path(__file__).resolve().parents[1] / "examples" / "candidates"


@pytest.fixture(scope="module")
def config(shared_build_cache) -> RuntimeConfig:
    return RuntimeConfig(cache_dir=shared_build_cache)  # arch read from the device


def _load(name: str, config: RuntimeConfig):
    spec = importlib.util.spec_from_file_location(f"pack_gpu_{name}", CANDIDATES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for kernel in find_kernels(module):
        kernel.build(config)
    return module


@pytest.fixture(autouse=True)
def strict_fp32():
    """References in strict fp32 (TF32 off), restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _close(out, ref, tol: float) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    err = (out.double() - ref.double()).abs()
    bound = tol + tol * ref.double().abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"max abs error {err.max().item():.3g}, worst error/tolerance {worst:.3g}"


@pytest.mark.parametrize("rows,cols", [(512, 1024), (7, 16384), (33, 4), (5, 1000), (3, 20000), (2, 70001)])
def test_layer_norm_both_paths(config, rows, cols):
    module = _load("layer_norm_cute", config)
    torch.manual_seed(0)
    model = module.ModelNew(cols).cuda()
    with torch.no_grad():
        model.norm.weight.normal_()
        model.norm.bias.normal_()
    x = torch.randn(rows, cols, device="cuda") * 3 + 2
    with use_config(config), torch.no_grad():
        out = model(x)
        ref = torch.nn.functional.layer_norm(x, (cols,), model.norm.weight, model.norm.bias, model.norm.eps)
    _close(out, ref, 1e-4)


def test_layer_norm_misaligned_view_takes_the_split_path(config):
    module = _load("layer_norm_cute", config)
    model = module.ModelNew(1024).cuda()
    x = torch.randn(64 * 1024 + 1, device="cuda")[1:].view(64, 1024)  # 4 bytes past a 16-byte boundary
    with use_config(config), torch.no_grad():
        _close(model(x), torch.nn.functional.layer_norm(x, (1024,)), 1e-4)


@pytest.mark.parametrize("m,n,k", [(512, 384, 256), (129, 260, 36), (1, 4, 4), (300, 1000, 1000)])
def test_matmul_3xtf32_is_fp32_accurate(config, m, n, k):
    module = _load("matmul_3xtf32_cute", config)
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    with use_config(config), torch.no_grad():
        out = module.ModelNew()(a, b)
    _close(out, a @ b, 1e-4)
    # At least as close to the exact product as PyTorch's own fp32 result, within a factor 2.
    exact = a.double() @ b.double()
    assert (out.double() - exact).abs().max() <= 2 * (a @ b - exact).abs().max() + 1e-6


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (200, 264, 72), (130, 8, 8), (1, 256, 64)])
def test_gemm_bf16_wgmma(config, m, n, k):
    module = _load("gemm_bf16_wgmma", config)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    with use_config(config), torch.no_grad():
        out = module.ModelNew()(a, b)
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    _close(out, ref, 2e-2)


@pytest.mark.parametrize("m,n,k", [(300, 264, 136), (128, 256, 64)])
def test_linear_bias_gelu_bf16(config, m, n, k):
    module = _load("gemm_bf16_wgmma", config)
    model = module.LinearGeluNew(k, n).cuda().to(torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    with use_config(config), torch.no_grad():
        out = model(x)
        ref = torch.nn.functional.gelu(x.float() @ model.linear.weight.float().t() + model.linear.bias.float())
    _close(out, ref.to(torch.bfloat16), 2e-2)


def test_gemm_bf16_rejects_unaligned_shapes(config):
    from cutegen.runtime import KernelError

    module = _load("gemm_bf16_wgmma", config)
    a = torch.randn(64, 12, device="cuda", dtype=torch.bfloat16)  # K = 12: rows are not 16-byte multiples
    b = torch.randn(12, 64, device="cuda", dtype=torch.bfloat16)
    with use_config(config), pytest.raises(KernelError, match="cudaErrorInvalidValue"):
        module.ModelNew()(a, b)


@pytest.mark.parametrize("shape,conv_args", [
    ((8, 16, 32, 32), dict(out_channels=32, kernel_size=3, padding=1)),
    ((2, 3, 17, 23), dict(out_channels=70, kernel_size=5, stride=2, padding=2, dilation=1)),
    ((1, 40, 15, 9), dict(out_channels=8, kernel_size=(3, 2), stride=(1, 2), padding=(0, 1), dilation=2)),
    ((3, 33, 6, 6), dict(out_channels=5, kernel_size=1, bias=False)),
])
def test_conv2d_implicit_gemm(config, shape, conv_args):
    module = _load("conv2d_implicit_gemm_cute", config)
    model = module.ModelNew(shape[1], conv_args["out_channels"]).cuda()
    model.conv = torch.nn.Conv2d(shape[1], **conv_args).cuda()  # the kernel reads the layer's settings
    x = torch.randn(*shape, device="cuda")
    with use_config(config), torch.no_grad():
        _close(model(x), model.conv(x), 1e-4)
