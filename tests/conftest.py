"""Shared fixtures: paths to the shipped examples and, when present, a KernelBench checkout."""

from __future__ import annotations

import functools
import os
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_TASKS = REPO / "examples" / "tasks"


def _kernelbench_root() -> Path | None:
    # A user's machine has no KernelBench beside the repo: the tests that need it skip.
    for candidate in (os.environ.get("CUTEGEN_KERNELBENCH"), REPO.parent / "shared" / "kernelbench"):
        if candidate and (Path(candidate) / "level1").is_dir():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def kernelbench_root() -> Path:
    root = _kernelbench_root()
    if root is None:
        pytest.skip("no KernelBench checkout (set CUTEGEN_KERNELBENCH to one)")
    return root


@pytest.fixture(scope="session")
def example_tasks() -> Path:
    return EXAMPLE_TASKS


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def nvcc_available() -> bool:
    return bool(shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists())


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    has_cuda = cuda_available()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike, so the lists agree
        items.sort(key=_heavy_first)


def _heavy_first(item) -> int:
    """Long work is handed out first, so that no core waits alone for it at the end of a parallel run:
    the files whose module-scoped fixture runs a whole bench or cluster, then nvcc compiles, then the
    rest (a stable sort keeps collection order within each)."""
    if _defines_module_fixture(Path(str(item.fspath))):
        return 0
    return 1 if "nvcc" in item.keywords else 2


_MODULE_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["']module["']""")


@functools.lru_cache(maxsize=None)
def _defines_module_fixture(path: Path) -> bool:
    try:
        return bool(_MODULE_FIXTURE.search(path.read_text(encoding="utf-8")))
    except OSError:
        return False


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown (and unused) without it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` (pyproject's addopts), grouped our way: the tests of a file that defines a
    module-scoped fixture (a replayed bench run, a Ray cluster) go to one worker, so that fixture is
    made once; every other test is handed out alone, which keeps the cores busy to the end (a file
    per worker left one core idle while the last long file ran). None: xdist's own choice."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FixtureScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _defines_module_fixture(config.rootpath / path) else nodeid

    return FixtureScopeScheduling(config, log)


def pytest_runtest_logreport(report):
    """With CUTEGEN_TEST_REPORT set, append each test's outcome and seconds, and a failure's text, to
    that file as soon as the test ends: a GPU run cut off by its time limit keeps what it found (pytest
    prints failures and writes --junitxml only at the end)."""
    path = os.environ.get("CUTEGEN_TEST_REPORT")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{report.outcome.upper()} {report.nodeid} ({report.when}, {report.duration:.1f} s)\n")
        if report.failed:
            out.write(report.longreprtext[-6000:] + "\n\n")


def pytest_addoption(parser):
    parser.addoption("--results-dir", default=os.environ.get("CUTEGEN_TEST_RESULTS") or None,
                     help="Where GPU tests write their results tables (NAME.json and NAME.md, with the machine"
                          " manifest); default CUTEGEN_TEST_RESULTS, else a temporary folder. bench/h200_all.sh"
                          " sets it; the tables of record are kept in bench/results/.")


@pytest.fixture(scope="session")
def results_dir(request, tmp_path_factory) -> Path:
    """The folder GPU tests write their results tables into (tests/results_table.py)."""
    given = request.config.getoption("--results-dir")
    return Path(given) if given else tmp_path_factory.mktemp("results")


@pytest.fixture(scope="session")
def shared_build_cache(tmp_path_factory) -> Path:
    """The build cache of tests that only use (not measure) builds: CUTEGEN_TEST_BUILD_CACHE when set
    (bench/h200_all.sh points it at the kernels it prebuilt in parallel), else one folder for the whole
    run, shared by its xdist workers, so a kernel several tests build is compiled once (the cache takes
    a lock per key: a second builder waits for the first and loads its library)."""
    given = os.environ.get("CUTEGEN_TEST_BUILD_CACHE")
    if given:
        return Path(given)
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-builds"
    shared.mkdir(exist_ok=True)
    return shared
