"""The shipped recorded replies: their candidates pass the static checks of their backend, and the CuTe
and plain-CUDA ones compile (all but the first, whose compile error is the point) for sm_90a with nvcc,
compile-only; one whose exact inputs built before is not built again (tests/compile_record.py)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError
from cutegen.evaluate.checks_static import run_static_checks
from cutegen.extract import extract_candidate
from cutegen.runtime import find_kernels, library_key

from compile_record import compiled_before, remember
from helpers import needs_nvcc

REPLAYS = Path(__file__).resolve().parents[1] / "examples" / "replays"
SEQUENCE = ["generate", "repair_build", "optimize", "optimize"]


def replies(name: str) -> list[dict]:
    return [json.loads(line) for line in (REPLAYS / name).read_text().splitlines()[1:]]


@pytest.mark.parametrize(("name", "backend"), [("swish_scale_torch.jsonl", "torch"), ("swish_scale_cute.jsonl", "cute"),
                                             ("swish_scale_cuda.jsonl", "cuda")])
def test_replies_follow_the_workflow_and_pass_static_checks(name, backend):
    lines = replies(name)
    assert [line["stage"] for line in lines] == SEQUENCE
    assert "not the output of any model" in json.loads((REPLAYS / name).read_text().splitlines()[0])["about"]
    for line in lines:
        candidate = extract_candidate(line["text"])
        assert run_static_checks(candidate.source, backend=backend) == ()
        if backend == "cuda":  # plain CUDA: under cute only the CuTe check objects
            assert {f.check for f in run_static_checks(candidate.source, backend="cute")} == {"check_uses_cute"}


def _kernel(text: str):
    module = types.ModuleType("replayed_candidate")
    exec(compile(extract_candidate(text).source, "replayed_candidate", "exec"), module.__dict__)  # noqa: S102
    (kernel,) = find_kernels(module)
    return kernel


# The compile error each file's first reply is there for.
FIRST_ERRORS = {"swish_scale_cute.jsonl": 'identifier "sigmoidf" is undefined',
                # the dim3 vexing parse, named by the pre-nvcc check (runtime/precheck.py) with its fix
                "swish_scale_cuda.jsonl": "declares a function named `grid` (the most vexing parse)"}


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", sorted(FIRST_ERRORS))
def test_kernel_replies_compile_except_the_broken_first(name, shared_build_cache):
    # The run's shared cache: the split-execution tests of test_agent_cli.py build the repairs too.
    config = RuntimeConfig(cache_dir=shared_build_cache, arch="sm_90a")
    first, *fixed = replies(name)
    with pytest.raises(BuildError) as err:
        _kernel(first["text"]).build(config)
    assert FIRST_ERRORS[name] in err.value.distilled
    for line in fixed:
        kernel = _kernel(line["text"])
        key = library_key(kernel.source, config)
        if compiled_before([key]):
            continue  # built with these exact inputs before (tests/compile_record.py)
        result = kernel.build(config)
        assert result.arch == "sm_90a" and result.library_path.is_file() and result.cache_key == key
        remember(f"{name}: {line['stage']}", [key])
