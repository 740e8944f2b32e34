"""The candidate folder of the GPU --evaluate check (tests/fixtures/bench_candidates): every file is
named for a task, declares its kernels correctly, says what verdict it must get, and what the static
checks can see (the cheating op call) they see; with nvcc, every CuTe source compiles for sm_90a
except the one meant not to. The GPU verdicts themselves: tests/test_bench_evaluate_gpu.py."""

from __future__ import annotations

import importlib.util
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cutegen import bench
from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError
from cutegen.evaluate.checks_static import run_static_checks
from cutegen.runtime import check_key, find_kernels
from cutegen.tasks import load_tasks

from compile_record import compiled_before, remember
from helpers import needs_nvcc

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "tests" / "fixtures" / "bench_candidates"
FILES = sorted(FOLDER.glob("*.py"))


def expectation(path: Path) -> tuple[str, set[str]]:
    match = re.match(r"# expect: (\S+)(?: (\S+))?$", path.read_text().splitlines()[0])
    assert match, f"{path.name}: the first line must be '# expect: pass' or '# expect: <stage> <failures>'"
    return match.group(1), set((match.group(2) or "").split("|")) - {""}


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_candidate_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # declaring a CuteKernel checks its codes against the C source
    return module


def test_the_folder_names_every_file_for_a_task_with_honest_and_broken_ones():
    found, unmatched = bench.find_candidates(load_tasks(REPO / "examples" / "tasks"), FOLDER)
    assert unmatched == [] and len(found) == len(FILES) >= 10
    verdicts = [expectation(p)[0] for p in FILES]
    assert verdicts.count("pass") == 6 and {"static", "build", "correctness"} <= set(verdicts)
    table = (FOLDER / "README.md").read_text()
    assert all(f"| {p.name} |" in table for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_file_declares_its_kernels_and_static_checks_agree(path):
    module = _import(path)
    assert hasattr(module, "ModelNew") and find_kernels(module)
    stage, failures = expectation(path)
    found = {f.check for f in run_static_checks(path.read_text(), backend="cute")}
    assert found == (failures if stage == "static" else set())


@pytest.mark.nvcc
@needs_nvcc
def test_cute_sources_compile_for_sm90a_except_the_broken_build(tmp_path):
    config = RuntimeConfig(cache_dir=tmp_path / "cache", arch="sm_90a")
    # Files that differ from their sample 0 only after the build (wrong results, crashes) are left
    # out: their sources compile like their honest twins; the compile error is the one to see fail.
    # A file meant to compile whose exact inputs compiled before is not compiled again
    # (tests/compile_record.py); the broken build always is.
    keys = {p.name: [check_key(k.source, config) for k in find_kernels(_import(p))]
            for p in FILES if expectation(p)[0] == "pass"}
    paths = [p for p in FILES if expectation(p)[0] == "build" or p.name in keys and not compiled_before(keys[p.name])]

    def build(path: Path) -> tuple[str, str | None]:
        try:
            for kernel in find_kernels(_import(path)):
                kernel.check(config)  # the device code alone (nvcc -cubin): the host compiler adds no error here
        except BuildError as err:
            return path.name, err.distilled or err.problem
        return path.name, None

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = dict(pool.map(build, paths))
    for path in paths:
        if expectation(path)[0] == "build":
            assert outcomes[path.name] and "swish" in outcomes[path.name], outcomes[path.name]
        else:
            assert outcomes[path.name] is None, f"{path.name}: {outcomes[path.name]}"
            remember(path.name, keys[path.name])
