"""Static anti-cheat checks: every static cheat fixture is caught by the check its header names under
every backend it applies to, and no honest candidate (torch-, cute- and cuda-backend fixtures, shipped
CuTe examples, the hand-written KernelBench-format plain-CUDA candidates) is flagged.

Fixtures live in tests/fixtures/cheats/NN_<name>.py; each starts with a header:

    # exploit: what the candidate does to fake a result or a speedup
    # caught-by: the name of the check function that must catch it
    # task: the example task it targets (examples/tasks/<task>.py)
    # task-file: only for a task that is not an example: its repo-relative path (tests/fixtures/tasks/)
    # backend: cute | cuda | torch (the backend the candidate was written for)
    # backends: the backends it applies to, e.g. `cute, cuda` (default: cute -> cute, cuda; else its backend)
    # needs: cuda (only when running it needs a GPU)

tests/fixtures/cheats/README.md has the table of fixture -> check. Fixtures whose check is dynamic are
exercised in test_checks_dynamic.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cutegen.errors import ConfigError
from cutegen.evaluate import checks_dynamic, checks_static, compare
from cutegen.evaluate.checks_static import BACKENDS, STATIC_CHECK_BACKENDS, STATIC_CHECKS, run_static_checks

from helpers import backends, header, task_path

REPO = Path(__file__).resolve().parents[1]
CHEATS = sorted((REPO / "tests" / "fixtures" / "cheats").glob("[0-9][0-9]_*.py"))
HONEST = sorted((REPO / "tests" / "fixtures" / "honest").glob("*.py"))
CUTE_EXAMPLES = sorted((REPO / "examples" / "candidates").glob("*.py"))
STATIC_NAMES = {check.__name__ for check in STATIC_CHECKS}
DYNAMIC_NAMES = {
    "disallowed_ops", "audit_kernels", "global_state_changes", "new_threads", "check_output_types",
    "check_nonfinite", "inputs_mutated", "ghost_probe", "churn_free_memory", "compare_outputs",
    "compare_precision",
}

# Checks of the timing stage and of the worker's end (pipeline.py, clock.py); `none`: a cheat that must
# be timed no faster than its honest twin.
STAGE_CHECKS = {"parent_clock", "timed_outputs", "work_past_stream", "worker_crashed", "worker_protocol", "guard_refused", "write_outside_scratch",
                "none"}
STATIC_CHEATS = [p for p in CHEATS if header(p).get("caught-by") in STATIC_NAMES]
DYNAMIC_CHEATS = [p for p in CHEATS if header(p).get("caught-by") in DYNAMIC_NAMES]
# (fixture, backend) for each backend a fixture applies to.
STATIC_RUNS = [(p, b) for p in STATIC_CHEATS for b in backends(p)]
DYNAMIC_RUNS = [(p, b) for p in DYNAMIC_CHEATS for b in backends(p)]
# The hand-written KernelBench-format plain-CUDA candidates (load_inline, no CuTe).
KERNELBENCH_CUDA = sorted((REPO / "bench" / "candidates" / "cuda").glob("level_*_kernel.py"))


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def _run_ids(runs: list[tuple[Path, str]]) -> list[str]:
    return [f"{p.stem}-{b}" for p, b in runs]


# ------------------------------------------------------------------------------ the fixture set


def test_there_are_enough_cheat_fixtures():
    assert len(CHEATS) >= 22


@pytest.mark.parametrize("path", CHEATS, ids=_ids(CHEATS))
def test_cheat_header_is_complete(path):
    fields = header(path)
    assert fields.get("exploit"), "every cheat says what it exploits"
    assert fields.get("backend") in BACKENDS
    assert set(backends(path)) <= set(BACKENDS) and backends(path), "the backends line names known backends"
    assert fields.get("task")
    task_file = task_path(path, REPO)
    assert task_file.is_file(), task_file
    assert task_file.stem == fields["task"]  # the bench resolves `task-file` when present, else `task`
    caught_by = fields.get("caught-by")
    modules = (checks_static, checks_dynamic, compare)
    if caught_by in STAGE_CHECKS:  # judged by the pipeline's timing stage or the worker's end
        assert fields.get("twin"), path.name
        # a native write (88, 89) reaches the confinement past the hook, which sees only Python
        assert caught_by in ("guard_refused", "write_outside_scratch") or fields.get("layer") in ("timing", "guard-off"), \
            path.name
        return
    assert caught_by in STATIC_NAMES | DYNAMIC_NAMES
    assert any(callable(getattr(m, caught_by, None)) for m in modules)


def test_every_check_has_a_fixture():
    named = {header(p)["caught-by"] for p in CHEATS}
    assert STATIC_NAMES <= named, f"static checks without a fixture: {STATIC_NAMES - named}"
    assert DYNAMIC_NAMES <= named, f"dynamic checks without a fixture: {DYNAMIC_NAMES - named}"


def test_readme_lists_every_fixture():
    readme = (REPO / "tests" / "fixtures" / "cheats" / "README.md").read_text()
    for path in CHEATS:
        assert f"| {path.name} | {header(path)['caught-by']} |" in readme, path.name
        row = next(line for line in readme.splitlines() if line.startswith(f"| {path.name} |"))
        assert row.split(" | ")[4] == ", ".join(backends(path)), f"{path.name}: the backends column is out of date"


def test_the_fixture_suite_runs_under_both_own_kernel_backends():
    """cute and cuda are judged by the same checks except check_uses_cute: every fixture that applies
    to cute applies to cuda too, except the CuTe check's own; and every static fixture whose check
    applies to cuda is run under cuda."""
    cute_only = [p.name for p in CHEATS if "cute" in backends(p) and "cuda" not in backends(p)]
    assert cute_only == ["25_no_cute.py"]
    missing = [p.name for p in STATIC_CHEATS
               if "cuda" in STATIC_CHECK_BACKENDS[header(p)["caught-by"]] and "cuda" not in backends(p)]
    assert missing == []


# ------------------------------------------------------------------------- caught, not flagged


@pytest.mark.parametrize("path, backend", STATIC_RUNS, ids=_run_ids(STATIC_RUNS))
def test_static_cheat_is_caught_by_its_check(path, backend):
    fields = header(path)
    source = path.read_text()
    assert backend in STATIC_CHECK_BACKENDS[fields["caught-by"]], "the fixture's check applies to its backends"
    findings = run_static_checks(source, backend=backend)
    assert fields["caught-by"] in {f.check for f in findings}
    direct = getattr(checks_static, fields["caught-by"])(ast.parse(source))
    assert direct and all(f.check == fields["caught-by"] for f in direct)
    assert all(f.line is None or f.line >= 1 for f in direct)


@pytest.mark.parametrize("path, backend", DYNAMIC_RUNS, ids=_run_ids(DYNAMIC_RUNS))
def test_dynamic_cheat_gets_past_every_static_check(path, backend):
    """A fixture for a dynamic check must reach it: no static check of a backend it applies to may
    fire first (the evaluator stops at the first failing stage), else the dynamic check goes unproven."""
    assert run_static_checks(path.read_text(), backend=backend) == ()


# Each of these fixtures gets past a static check by one indirection; written directly, the same
# exploit is caught by that check. This pins where the static analysis stops and the dynamic check
# has to take over (and fails when the static check learns the indirection: rework the fixture then).
INDIRECTIONS = [
    ("32_allow_tf32.py", "torch._C._set_cublas_allow_tf32(True)",
     "torch.backends.cuda.matmul.allow_tf32 = True", "check_no_patching"),
    ("33_late_thread.py", "_Thread = queue.threading.Thread",
     "import threading\n_Thread = threading.Thread", "check_no_concurrency"),
    ("37_dispatch_evasion.py", 'sys.modules.get("torch.utils._python_dispatch")',
     'sys.modules["torch.utils._python_dispatch"]', "check_no_patching"),
    ("40_heap_reference.py", 'heap = sys.modules.get("gc")', "import gc\n        heap = gc", "check_no_frame_access"),
]


@pytest.mark.parametrize("name, hidden, direct, check", INDIRECTIONS, ids=[i[0] for i in INDIRECTIONS])
def test_dynamic_cheat_written_directly_is_caught_statically(name, hidden, direct, check):
    path = REPO / "tests" / "fixtures" / "cheats" / name
    source = path.read_text()
    assert source.count(hidden) == 1
    for backend in backends(path):
        assert run_static_checks(source, backend=backend) == ()
        findings = run_static_checks(source.replace(hidden, direct), backend=backend)
        assert {f.check for f in findings} == {check}, findings


CUTE_DYNAMIC_CHEATS = [p for p in DYNAMIC_CHEATS if header(p)["backend"] == "cute"]


@pytest.mark.parametrize("path", CUTE_DYNAMIC_CHEATS, ids=_ids(CUTE_DYNAMIC_CHEATS))
def test_cute_dynamic_cheat_carries_a_real_cute_kernel(path):
    """Under the cute and cuda backends the kernel-source checks come first: these fixtures carry a
    kernel written on CuTe tensors; without its source the same candidate is rejected by
    check_has_kernel_source alone (and check_uses_cute has nothing to read)."""
    tree = ast.parse(path.read_text())
    assert checks_static.check_uses_cute(tree) == [] and checks_static.check_has_kernel_source(tree) == []
    for node in ast.walk(tree):  # drop every string holding kernel source
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
            node.value = ""
    stripped = ast.unparse(tree)
    for backend in ("cute", "cuda"):
        assert {f.check for f in run_static_checks(stripped, backend=backend)} == {"check_has_kernel_source"}


@pytest.mark.parametrize("path", HONEST, ids=_ids(HONEST))
def test_honest_fixture_has_no_finding(path):
    """Under each of its backends, and under torch (which only looks for cheats)."""
    for backend in {*backends(path), "torch"}:
        assert run_static_checks(path.read_text(), backend=backend) == ()
    if header(path).get("backend") == "cuda":  # plain CUDA: under cute only the CuTe check objects
        assert {f.check for f in run_static_checks(path.read_text(), backend="cute")} == {"check_uses_cute"}


@pytest.mark.parametrize("path", KERNELBENCH_CUDA, ids=_ids(KERNELBENCH_CUDA))
def test_kernelbench_plain_cuda_candidate_passes_under_cuda_and_only_lacks_cute(path):
    """Other systems' honest kernels (KernelBench format, load_inline, no CuTe) are judged under cuda
    with every other check of the cute backend: nothing is flagged; under cute only the CuTe check is."""
    source = path.read_text()
    assert "load_inline" in source and "cute::" not in source and "<cute/" not in source
    assert run_static_checks(source, backend="cuda") == ()
    assert {f.check for f in run_static_checks(source, backend="cute")} == {"check_uses_cute"}


def test_there_are_thirteen_kernelbench_plain_cuda_candidates():
    assert len(KERNELBENCH_CUDA) == 13
    assert {p.name for p in KERNELBENCH_CUDA} >= {"level_1_problem_19_sample_0_kernel.py",
                                                  "level_1_problem_1_sample_0_kernel.py"}


@pytest.mark.parametrize("path", CUTE_EXAMPLES, ids=_ids(CUTE_EXAMPLES))
def test_shipped_cute_example_has_no_finding(path):
    for backend in ("cute", "cuda"):  # CuTe is allowed under cuda
        assert run_static_checks(path.read_text(), backend=backend) == ()


def test_honest_torch_candidates_are_cheats_under_the_own_kernel_backends():
    """The same torch code that is honest under "torch" computes with PyTorch under "cute" and "cuda"."""
    torch_backend = [p for p in HONEST if header(p).get("backend") == "torch"]
    assert torch_backend
    for path in torch_backend:
        for backend in ("cute", "cuda"):
            names = {f.check for f in run_static_checks(path.read_text(), backend=backend)}
            assert names == {"check_forward_allowlist", "check_has_kernel_source"}, (path.name, backend)


def test_each_check_says_where_it_applies():
    """One set of checks (DESIGN.md, "Backends"): the own-kernel checks apply to cute and cuda, the
    CuTe check to cute alone, every other check to all three backends."""
    assert set(STATIC_CHECK_BACKENDS) == STATIC_NAMES
    own = {name for name, where in STATIC_CHECK_BACKENDS.items() if where == {"cute", "cuda"}}
    assert own == {"check_forward_allowlist", "check_has_kernel_source"}
    assert STATIC_CHECK_BACKENDS["check_uses_cute"] == {"cute"}
    assert all(where == set(BACKENDS) for name, where in STATIC_CHECK_BACKENDS.items()
               if name not in own | {"check_uses_cute"})
    assert set(BACKENDS) == {"cute", "cuda", "torch"}


# ------------------------------------------------------------------ the allow list, case by case

_PRELUDE = "import torch\nimport torch.nn as nn\nfrom torch.nn import functional as F\n"


def _forward(body: str, init: str = "pass", extra: str = "") -> str:
    return (
        f"{_PRELUDE}{extra}\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        {init}\n"
        "    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:\n"
        + "".join(f"        {line}\n" for line in body.splitlines())
    )


def _allowlist(source: str) -> list[str]:
    return [f.message for f in checks_static.check_forward_allowlist(ast.parse(source))]


@pytest.mark.parametrize(
    "body",
    [
        "mm = torch.matmul\nreturn mm(x, w)",
        "return x @ w",
        "y = torch.empty_like(x)\ny.copy_(x)\nreturn y",
        "return x.float()",
        "return x.to(torch.float16)",
        "return torch.ops.aten.mm.default(x, w)",
        "return x.softmax(-1)",
        "return torch.Tensor.sum(x)",
        "return x.contiguous().view(-1).cumsum(0)",
        "relu = getattr(F, 'relu')\nreturn relu(x)",
        "return self.helper(x)",
        "return (lambda t: t.exp())(x)",
        "return x.to(x.device, torch.bfloat16)",
        "if x.is_cuda:\n    return torch.relu(x)\nreturn x",
        "if not x.is_contiguous():\n    return torch.relu(x)\nreturn x",
    ],
)
def test_allowlist_flags_compute(body):
    extra = ""
    source = _forward(body, extra=extra)
    if "self.helper" in body:
        source += "    def helper(self, t):\n        return t.tanh()\n"
    assert _allowlist(source), body


@pytest.mark.parametrize(
    "body",
    [
        "y = torch.empty_like(x)\nreturn y",
        "y = x.new_zeros(x.shape)\ny.fill_(0)\nreturn y.view(-1)",
        "n = x.numel()\ns = x.stride(0)\np = x.data_ptr()\nreturn torch.empty((n,), device=x.device)",
        "y = x.t().contiguous()\nreturn y.reshape(x.shape[0], -1).unsqueeze(0).squeeze(0)",
        "stream = torch.cuda.current_stream(x.device).cuda_stream\nreturn torch.zeros(3)",
        "with torch.no_grad():\n    out = torch.empty(4, dtype=x.dtype)\nreturn out",
        "out = torch.empty_like(x)\nself.kern.softmax(x, out, x.numel())\nreturn out",
        "out = torch.empty_like(x)\n_lib.matmul(x, w, out)\nreturn out",
        "vals = {'a': 1}\nfor v in vals.values():\n    pass\nreturn torch.empty(1)",
        "grid = (math.ceil(x.numel() / 256),)\nreturn torch.empty(grid)",
        "return torch.empty_like(x.cuda()).to(x.device)",
        "if not x.is_cuda:\n    return x * torch.sigmoid(x)\nreturn torch.empty_like(x)",
        "return torch.empty_like(x) if x.is_cuda else F.relu(x)",
        "if x.device.type == 'cpu' or not torch.cuda.is_available():\n    return x.sum()\nreturn torch.empty(1)",
    ],
)
def test_allowlist_allows_allocation_views_and_own_kernels(body):
    """Includes CPU fallbacks: branches that run only off the GPU never run in the evaluator."""
    extra = "import math\nfrom cutegen.runtime import CuteKernel\n_lib = CuteKernel('src')\n"
    source = _forward(body, init="self.kern = CuteKernel('src')", extra=extra)
    assert _allowlist(source) == [], body


def test_allowlist_ignores_compute_in_init_but_not_in_forward():
    source = _forward(
        "return self.w_t",
        init="self.w_t = torch.randn(4, 4).t().contiguous().mul(2.0)",
    )
    assert _allowlist(source) == []


def test_allowlist_flags_star_import_from_torch():
    source = "from torch import *\n" + _forward("return empty(3)")
    assert any("import *" in m for m in _allowlist(source))


def test_allowlist_reports_a_missing_model_new():
    findings = checks_static.check_forward_allowlist(ast.parse("import torch\nclass Other: pass\n"))
    assert len(findings) == 1 and "ModelNew" in findings[0].message


def test_allowlist_follows_helper_objects_on_self():
    extra = "class Helper:\n    def run(self, t):\n        return torch.relu(t)\n"
    source = _forward("return self.h.run(x)", init="self.h = Helper()", extra=extra)
    assert any("torch.relu" in m for m in _allowlist(source))


def test_allowlist_findings_carry_lines():
    source = _forward("y = torch.empty_like(x)\nreturn torch.sigmoid(y)")
    findings = checks_static.check_forward_allowlist(ast.parse(source))
    assert [f.line for f in findings] == [source.splitlines().index("        return torch.sigmoid(y)") + 1]


# ------------------------------------------------------------------------ other checks, case by case


def _findings(check, source: str) -> list[str]:
    return [f.message for f in check(ast.parse(source))]


def test_model_subclass_ignores_a_main_guard_and_the_reference_itself():
    source = (
        "import torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return Model\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
        "if __name__ == '__main__':\n    print(Model()(1), ModelNew()(1))\n"
    )
    assert _findings(checks_static.check_not_model_subclass, source) == []


def test_model_subclass_sees_an_intermediate_base():
    source = "class Model: pass\nclass Base(Model): pass\nclass ModelNew(Base): pass\n"
    assert _findings(checks_static.check_not_model_subclass, source)


def test_lazy_global_kernel_is_not_a_globals_write():
    source = "_k = None\ndef get():\n    global _k\n    if _k is None:\n        _k = object()\n    return _k\n"
    assert _findings(checks_static.check_no_globals_write, source) == []
    assert _findings(checks_static.check_no_patching, source) == []


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsetattr(sys.modules[__name__], 'f', print)\n",
        "vars()['f'] = print\n",
        "import math\nmath.__dict__.update(pi=3)\n",
        "__builtins__['len'] = lambda x: 0\n",
    ],
)
def test_globals_write_forms(source):
    assert _findings(checks_static.check_no_globals_write, source)


def test_vars_of_self_is_not_a_globals_write():
    assert _findings(checks_static.check_no_globals_write, "class A:\n    def f(self):\n        vars(self)['x'] = 1\n") == []


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.backends.cudnn.benchmark = True\n",
        "import torch\ntorch.set_float32_matmul_precision('high')\n",
        "import torch\ntorch.manual_seed(0)\n",
        "import builtins\nbuiltins.isinstance = lambda a, b: True\n",
        "import torch\ndel torch.Tensor.__eq__\n",
        "class Model: pass\nModel.forward = lambda self, x: x\n",
        "import os\nos.environ.update(NVIDIA_TF32_OVERRIDE='1')\n",
        "import cutegen.evaluate.compare as c\nc.compare_outputs = None\n",
        "import torch\nwith torch.backends.cudnn.flags(allow_tf32=True):\n    pass\n",
    ],
)
def test_patching_forms(source):
    assert _findings(checks_static.check_no_patching, source)


@pytest.mark.parametrize(
    "source",
    [
        "import os\nflag = os.environ.get('X')\n",
        "import torch\nwith torch.set_grad_enabled(False):\n    pass\n",
        "class A:\n    def f(self):\n        self.scale = 2\n        setattr(self, 'x', 1)\n",
        "import torch\ng = torch.Generator().manual_seed(1)\n",
    ],
)
def test_not_patching(source):
    assert _findings(checks_static.check_no_patching, source) == []


def test_shape_keyed_workspace_cache_is_allowed():
    source = _forward(
        "key = (tuple(x.shape), x.dtype)\n"
        "if key not in self.ws:\n    self.ws[key] = torch.empty(x.numel())\n"
        "return self.ws[key]",
        init="self.ws = {}",
    )
    assert _findings(checks_static.check_no_module_cache, source) == []


def test_id_keyed_cache_on_self_is_flagged():
    source = _forward("return self.memo.get(id(x))", init="self.memo = {}")
    assert _findings(checks_static.check_no_module_cache, source)


def test_parameter_gather_is_not_a_cache():
    source = _forward("return self.table[x]", init="self.table = nn.Parameter(torch.randn(4))")
    assert _findings(checks_static.check_no_module_cache, source) == []


def test_private_streams_and_concurrency_in_cxx_ignore_comments():
    quiet = 'SRC = r"""\n// cudaStreamCreate and std::thread are not used here\n__global__ void k() {}\n"""\n'
    loud = 'SRC = r"""\n__global__ void k() {}\nvoid f() { std::thread t(k); cudaStream_t s; cudaStreamCreate(&s); }\n"""\n'
    assert _findings(checks_static.check_no_private_streams, quiet) == []
    assert _findings(checks_static.check_no_concurrency, quiet) == []
    assert _findings(checks_static.check_no_private_streams, loud)
    assert _findings(checks_static.check_no_concurrency, loud)


def test_uses_cute_accepts_qualified_names_without_using_namespace():
    source = 'SRC = """\n__global__ void k(float* p, int n) {\n  auto t = cute::make_tensor(cute::make_gmem_ptr(p), cute::make_layout(n));\n}\n"""\n'
    assert _findings(checks_static.check_uses_cute, source) == []


def test_kernel_source_is_required_and_the_cute_check_leaves_that_to_it():
    assert _findings(checks_static.check_has_kernel_source, "import torch\n")
    assert _findings(checks_static.check_uses_cute, "import torch\n") == []
    commented = 'SRC = """\n// __global__ void k() {}\n#include <cuda_runtime.h>\n"""\n'
    assert _findings(checks_static.check_has_kernel_source, commented)  # a kernel in a comment is none
    plain = 'SRC = """\n__global__ void k(float* p) { p[threadIdx.x] = 0.f; }\n"""\n'
    assert _findings(checks_static.check_has_kernel_source, plain) == []
    assert _findings(checks_static.check_uses_cute, plain)


def test_dynamic_code_forms():
    for source in (
        "import importlib\nm = importlib.import_module('tor' + 'ch')\n",
        "import torch\nf = getattr(torch, 'mat' + 'mul')\n",
        "eval('1')\n",
        "import pickle\npickle.loads(b'')\n",
    ):
        assert _findings(checks_static.check_no_dynamic_code, source), source
    assert _findings(checks_static.check_no_dynamic_code, "import re\nre.compile('x')\n") == []


# ------------------------------------------------------------------------------------ the runner


def test_run_static_checks_reports_a_syntax_error_with_its_line():
    findings = run_static_checks("import torch\ndef broken(:\n", backend="torch")
    assert len(findings) == 1
    assert findings[0].check == "run_static_checks" and findings[0].line == 2


def test_run_static_checks_rejects_an_unknown_backend():
    with pytest.raises(ConfigError, match="backend") as err:
        run_static_checks("x = 1\n", backend="triton")
    assert "cute, cuda, torch" in err.value.fix


def test_torch_backend_skips_the_cute_only_checks():
    source = (REPO / "tests" / "fixtures" / "cheats" / "01_torch_matmul.py").read_text()
    assert run_static_checks(source, backend="torch") == ()
