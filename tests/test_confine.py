"""Nothing a candidate runs writes outside its worker's scratch directory (evaluate/confine.py): the
Landlock confinement refuses each write fixture (80-89) with EACCES, the verdict names
`write_outside_scratch` and the target is unchanged afterwards; the honest twins pass; the hash seal
stands in where Landlock is off and marks the environment poisoned; the build cache is written by
the evaluator only, and a confined worker finds what it built there."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cutegen.config import EvalConfig, RuntimeConfig
from cutegen.evaluate import confine, failure
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.service import Evaluator
from cutegen.tasks import load_task

from helpers import header, needs_nvcc, task_path

REPO = Path(__file__).resolve().parents[1]
CHEATS = REPO / "tests" / "fixtures" / "cheats"
HONEST = REPO / "tests" / "fixtures" / "honest"
WRITE_FIXTURES = sorted(p for p in CHEATS.glob("8[0-9]_*.py") if header(p)["caught-by"] == "write_outside_scratch")
PYTHON_WRITES = [p for p in WRITE_FIXTURES if header(p).get("layer") == "guard-off"]
FAKE_PACKAGE = "cutegen_fixture_site"  # what the installed-package fixtures look for
PACKAGE_TEXT = '"""A throwaway installed package for the confinement tests."""\nVALUE = 1\n'
OTHER_ENTRY = "ab" + "c" * 62  # a build already in the cache (another candidate's)
OTHER_CANDIDATE = "d" * 32
landlock = pytest.mark.skipif(confine.landlock_abi() == 0, reason="the kernel has no Landlock")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` (relative path -> sha256)."""
    return {str(p.relative_to(root)): _digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


@dataclass
class World:
    """What the write fixtures aim at, made for one test: a throwaway package on the workers' path, a
    build cache holding another build, another candidate's build folder, a run directory (the
    evaluator's working directory)."""

    root: Path
    site: Path
    cache: Path
    run_dir: Path
    config: EvalConfig

    @property
    def init(self) -> Path:
        return self.site / FAKE_PACKAGE / "__init__.py"

    def state(self) -> dict[str, dict[str, str]]:
        return {"site": _tree(self.site), "cache": _tree(self.cache), "run": _tree(self.run_dir)}


@pytest.fixture(scope="module")
def site_folder(tmp_path_factory) -> Path:
    """One folder for the throwaway package of every test here, emptied for each: the workers'
    PYTHONPATH then stays the same, so the evaluator's one fork server serves them all (a new path
    would start a fork server, which imports torch, for each test)."""
    return tmp_path_factory.mktemp("site")


@pytest.fixture()
def world(tmp_path, monkeypatch, site_folder) -> World:
    site = site_folder
    shutil.rmtree(site)
    (site / FAKE_PACKAGE).mkdir(parents=True)
    (site / FAKE_PACKAGE / "__init__.py").write_text(PACKAGE_TEXT)
    cache = tmp_path / "cache"
    entry = cache / "build" / OTHER_ENTRY[:2] / OTHER_ENTRY
    entry.mkdir(parents=True)
    (entry / "kernel.so").write_bytes(b"another candidate's library")
    extension = cache / "candidates" / OTHER_CANDIDATE / "torch_extensions" / "swish"
    extension.mkdir(parents=True)
    (extension / "swish.so").write_bytes(b"another candidate's extension")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "journal.jsonl").write_text("{}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH")))))
    monkeypatch.chdir(run_dir)  # the workers' parent's working directory: what fixture 87 aims at
    config = EvalConfig(device="cpu", backend="torch", do_timing=False, cache_dir=tmp_path / "eval",
                        run_timeout_s=120.0, correctness_trials=2, adversarial_trials=1, weight_seeds=1,
                        runtime=RuntimeConfig(cache_dir=cache / "build"))
    return World(tmp_path, site, cache, run_dir, config)


@pytest.fixture(scope="module")
def service():
    with Evaluator("cpu") as shared:
        yield shared


def _judge(path: Path, world: World, service, **over):
    config = replace(world.config, guard=header(path).get("layer") != "guard-off", **over)
    return evaluate_candidate(path, load_task(task_path(path, REPO)), config, service)


def _real_site_untouched() -> None:
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert not (purelib / FAKE_PACKAGE).exists() and not (purelib / "cutegen_fixture_startup.pth").exists()


# ------------------------------------------------------------------------------------- Landlock


def test_the_write_rights_follow_the_kernels_abi():
    """Rights a kernel does not know are masked out (it refuses a ruleset that names them): ABI 1 has
    the thirteen rights of its first version less the three reads, ABI 2 adds REFER (bit 13), ABI 3
    TRUNCATE (bit 14), and later ABIs add no write right (ioctl on devices stays allowed)."""
    first = 0b1_1111_1111_0010  # write_file, remove_dir/file, make_char/dir/reg/sock/fifo/block/sym
    assert confine.write_rights(0) == 0
    assert confine.write_rights(1) == first
    assert confine.write_rights(2) == first | 1 << 13
    assert confine.write_rights(3) == confine.write_rights(7) == first | 1 << 13 | 1 << 14


CONFINED_PROBE = r"""
import json, os, shutil, subprocess, sys, tempfile
from cutegen.evaluate.confine import confine
outside, scratch = sys.argv[1], sys.argv[2]
os.chdir(scratch)
os.environ["TMPDIR"] = scratch
tempfile.tempdir = None
done = {"confinement": confine(scratch).enforced}
def attempt(name, action):
    try:
        action()
        done[name] = "allowed"
    except OSError as err:
        done[name] = err.errno
target = os.path.join(outside, "module.py")
open("staged.py", "w").write("poisoned = True\n")
attempt("append", lambda: open(target, "a").write("poisoned = True\n"))
attempt("truncate", lambda: os.truncate(target, 0))
attempt("create", lambda: open(os.path.join(outside, "new.pth"), "w"))
attempt("mkdir", lambda: os.mkdir(os.path.join(outside, "package")))
attempt("rename", lambda: os.replace("staged.py", target))
attempt("copy", lambda: shutil.copyfile("staged.py", target))
attempt("remove", lambda: os.remove(target))
attempt("symlink", lambda: os.symlink("staged.py", os.path.join(outside, "link.py")))
child = subprocess.run(["sh", "-c", "echo poisoned >> " + target], capture_output=True, text=True)
done["child"] = child.returncode
attempt("scratch", lambda: (open("notes.txt", "w").write("ok"), os.replace("notes.txt", "final.txt")))
attempt("tmpdir", lambda: tempfile.NamedTemporaryFile().write(b"ok"))
attempt("dev_null", lambda: open("/dev/null", "w").write("ok"))
attempt("read", lambda: open(target).read())
print(json.dumps(done))
"""


def _confined_run(tmp_path: Path) -> tuple[dict, Path]:
    outside, scratch = tmp_path / "installed", tmp_path / "scratch"
    outside.mkdir()
    scratch.mkdir()
    (outside / "module.py").write_text("VALUE = 1\n")
    probe = subprocess.run([sys.executable, "-c", CONFINED_PROBE, str(outside), str(scratch)], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert probe.returncode == 0, probe.stderr
    return json.loads(probe.stdout), outside


@landlock
def test_landlock_refuses_every_kind_of_write_outside_and_allows_the_scratch_directory(tmp_path):
    """In a confined process: appending, truncating, creating, making a folder, renaming or copying
    over, removing and linking outside the scratch directory all fail with EACCES, from a child
    process too (the shell's redirection fails: status 2), and change nothing; writes in the scratch
    directory, its TMPDIR and /dev, and reads anywhere, are allowed."""
    done, outside = _confined_run(tmp_path)
    assert done["confinement"] is True
    for write in ("append", "truncate", "create", "mkdir", "rename", "copy", "remove", "symlink"):
        assert done[write] == 13, (write, done)
    assert done["child"] == 2
    assert {k: done[k] for k in ("scratch", "tmpdir", "dev_null", "read")} == dict.fromkeys(
        ("scratch", "tmpdir", "dev_null", "read"), "allowed")
    assert _tree(outside) == {"module.py": hashlib.sha256(b"VALUE = 1\n").hexdigest()}


SIGNAL_PROBE = r"""
import json, os, signal, subprocess, sys
from cutegen.evaluate.confine import confine
done = {"scoped": confine(sys.argv[1]).signals_scoped}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
for name, pid in (("parent", os.getppid()), ("other", int(sys.argv[2])), ("child", child.pid)):
    try:
        os.kill(pid, signal.SIGCONT)  # harmless to a running process, and a signal all the same
        done[name] = "allowed"
    except PermissionError:
        done[name] = "refused"
child.kill()
print(json.dumps(done))
"""


@pytest.mark.skipif(confine.landlock_abi() < confine.SCOPE_ABI, reason="signal scoping needs Landlock ABI 6")
def test_a_confined_worker_cannot_signal_the_evaluator_or_another_process_only_its_children(tmp_path):
    """A candidate's native code could stop the fork server (stalling every build worker it would
    start), the evaluator or another candidate's worker; from Landlock ABI 6 the confinement scopes
    signals to the worker's own tree."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # another worker, say
    try:
        probe = subprocess.run([sys.executable, "-c", SIGNAL_PROBE, str(tmp_path), str(other.pid)],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    finally:
        other.kill()
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {"scoped": True, "parent": "refused", "other": "refused", "child": "allowed"}


def test_a_refused_write_is_named_from_the_error_the_candidate_raised(tmp_path):
    """The worker's classification: a PermissionError naming a path outside the scratch directory (also
    as the target of a rename, or chained under the candidate's own error), or a child process's
    report of one in the message; not one inside it, nor an unrelated error."""
    scratch, outside = str(tmp_path / "scratch"), str(tmp_path / "installed" / "__init__.py")
    direct = PermissionError(13, "Permission denied", outside)
    rename = PermissionError(13, "Permission denied", "staged.py", None, outside)
    try:
        try:
            raise direct
        except PermissionError as inner:
            raise RuntimeError("could not plan the tiles") from inner
    except RuntimeError as outer:
        chained = outer
    child = RuntimeError(f"helper failed: PermissionError: [Errno 13] Permission denied: '{outside}'")
    shell = RuntimeError(f"sh: 1: cannot create {outside}: Permission denied")
    for err in (direct, rename, chained, child, shell):
        assert failure.refused_write(err, str(err), scratch) == outside
    inside = PermissionError(13, "Permission denied", os.path.join(scratch, "notes.txt"))
    assert failure.refused_write(inside, str(inside), scratch) is None
    assert failure.refused_write(ValueError("bad shape"), "bad shape", scratch) is None


# ------------------------------------------------------------------------ the fixtures, end to end


@landlock
@pytest.mark.parametrize("path", PYTHON_WRITES, ids=lambda p: p.stem)
def test_each_python_write_is_refused_and_nothing_changes(path, world, service):
    """Each write fixture, its audit hook off, against a world where its target exists: the write fails
    with EACCES inside the worker (the feedback quotes it), the verdict is `write_outside_scratch` and
    no other check failed, and the throwaway package, the build cache, the other candidate's folder
    and the run directory hold exactly what they held before."""
    before = world.state()
    verdict = _judge(path, world, service)
    assert verdict.failure == "write_outside_scratch", verdict.feedback
    assert "Permission denied" in verdict.feedback
    assert {c.name for c in verdict.checks if not c.passed} == {"write_outside_scratch"}
    assert world.state() == before
    _real_site_untouched()


@pytest.mark.parametrize("path", PYTHON_WRITES, ids=lambda p: p.stem)
def test_each_python_write_does_write_where_nothing_confines_it(path, world, service):
    """The refusals above are Landlock's, not a fixture's own mistake: with Landlock off (confinement
    "hashes") and the hook off, each fixture changes its target in the test's world (all of it under
    the test's folder). The seal sees only what the judge imports, so the verdict is not asserted."""
    before = world.state()
    _judge(path, world, service, confinement="hashes")
    assert world.state() != before
    _real_site_untouched()


@landlock
def test_the_honest_twin_passes_with_the_hook_on_and_off(world, service):
    """The twin's file work in its scratch directory and TMPDIR (write, append, rename, copy, remove, a
    folder) and its read of an installed package pass; the verdict says Landlock held."""
    for guard in (True, False):
        verdict = evaluate_candidate(HONEST / "confine_twin.py", load_task(REPO / "examples/tasks/swish_scale.py"),
                                     replace(world.config, guard=guard), service)
        assert verdict.passed, verdict.feedback
        (check,) = [c for c in verdict.checks if c.name == "write_outside_scratch"]
        assert check.passed and f"Landlock (ABI {confine.landlock_abi()})" in check.detail


def _compiles_extensions() -> bool:
    return bool(shutil.which("c++") and shutil.which("ninja"))


@landlock
@pytest.mark.skipif(not _compiles_extensions(), reason="needs a C++ compiler and ninja for load_inline")
def test_load_inline_builds_in_its_own_folder_and_native_writes_are_refused(world, service):
    """KernelBench's format on the CPU: the honest twin compiles under confinement into its own build
    folder (keyed by its source), which its build worker wrote and its run worker loaded; cheat 88,
    whose C++ code writes the package's __init__.py, is refused by Landlock with the audit hook on
    (it sees no Python write), and the package is unchanged."""
    twin = HONEST / "inline_cpp_swish_scale.py"
    verdict = evaluate_candidate(twin, load_task(REPO / "examples/tasks/swish_scale.py"), world.config, service)
    assert verdict.passed, verdict.feedback
    own = confine.candidate_folder(world.config.runtime, twin.read_text())
    assert list((own / "torch_extensions").glob("cutegen_honest_inline_swish/*.so"))
    before = world.state()
    cheat = CHEATS / "88_native_write_load_inline.py"
    verdict = _judge(cheat, world, service)
    assert verdict.failure == "write_outside_scratch" and "Permission denied" in verdict.feedback, verdict.feedback
    after = world.state()
    assert after["site"] == before["site"] and after["run"] == before["run"]
    cheats_own = f"candidates/{confine.candidate_folder(world.config.runtime, cheat.read_text()).name}/"
    assert {k: v for k, v in after["cache"].items() if not k.startswith(cheats_own)} == before["cache"]
    assert (world.cache / cheats_own / "torch_extensions" / "cutegen_fixture_native_write").is_dir()
    _real_site_untouched()


# ------------------------------------------------------------------------------- the hash seal


def test_the_seal_sees_a_changed_module_file_even_with_its_times_restored(tmp_path, monkeypatch):
    """Sealed: a module loaded in this process. Rewritten with the same size and its mtime set back, it
    is still a change (ctime cannot be set back, and its sha256 differs); rewritten with its own bytes
    it is none; once the process unloads the module it is not judged."""
    folder = tmp_path / "mods"
    folder.mkdir()
    module = folder / "cutegen_sealed_probe.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(folder))
    __import__("cutegen_sealed_probe")
    try:
        seal = confine.EnvironmentSeal()
        seal.extend()
        assert seal.changes() == []
        times = os.stat(module)
        module.write_text("VALUE = 2\n")
        os.utime(module, ns=(times.st_atime_ns, times.st_mtime_ns))
        assert seal.changes() == [f"{module}: changed (size 10 -> 10 bytes)"]
        module.write_text("VALUE = 1\n")
        assert seal.changes() == []
        module.write_text("VALUE = 3\n")
    finally:
        sys.modules.pop("cutegen_sealed_probe", None)
    assert all(str(module) not in line for line in seal.changes())


def test_without_landlock_the_seal_rejects_the_write_and_poisons_the_environment(world, service):
    """With Landlock off (confinement "hashes") fixture 80 really appends to the throwaway package,
    which this process imported: the seal compared after the candidate fails it with
    `write_outside_scratch`, naming the file; every later evaluation refuses to run with the file and
    the fix (reinstall, then delete the mark), until the mark is gone."""
    sys.path.insert(0, str(world.site))
    __import__(FAKE_PACKAGE)
    try:
        verdict = _judge(CHEATS / "80_append_package_init.py", world, service, confinement="hashes")
        assert "CUTEGEN_FIXTURE_POISONED" in world.init.read_text()  # nothing refused it: the seal saw it
        assert verdict.failure == "write_outside_scratch" and str(world.init) in verdict.feedback, verdict.feedback
        mark = world.config.cache_dir / confine.POISON_MARK
        assert str(world.init) in json.loads(mark.read_text())["changed"][0]
        twin = load_task(REPO / "examples/tasks/swish_scale.py")
        with pytest.raises(confine.EnvironmentPoisoned) as refused:
            evaluate_candidate(HONEST / "confine_twin.py", twin, world.config, service)
        assert str(world.init) in str(refused.value) and "Reinstall" in str(refused.value) and str(mark) in \
            str(refused.value)
        world.init.write_text(PACKAGE_TEXT)  # reinstalled
        mark.unlink()
        verdict = evaluate_candidate(HONEST / "confine_twin.py", twin, replace(world.config, confinement="hashes"),
                                     service)
        assert verdict.passed, verdict.feedback
        (check,) = [c for c in verdict.checks if c.name == "write_outside_scratch"]
        assert check.passed and check.detail.startswith("hash seal")
    finally:
        sys.modules.pop(FAKE_PACKAGE, None)
        sys.path.remove(str(world.site))


# ------------------------------------------------------------------- the build cache: trusted only

KERNEL = r"""
#include <cuda_runtime.h>
#include <cutlass/version.h>
__global__ void scale_kernel(float const* x, float* y, int n, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * s;
}
extern "C" int scale(float const* x, float* y, int n, float s, cudaStream_t stream) {
  scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, n, s);
  return cudaGetLastError();
}
"""

CANDIDATE = '''
import torch.nn as nn

from cutegen.runtime import CuteKernel

SOURCE = {source!r}
_kernel = CuteKernel(SOURCE, {{"scale": ("f32*", "f32*", "i32", "f32")}}, name="scale")
{extra}

class ModelNew(nn.Module):
    def forward(self, x):
        return x
'''


def test_the_build_worker_cannot_write_the_cache_and_a_malformed_report_is_refused(world, service):
    """The build pool's worker imports the candidate confined: an import that plants into the shared
    cache is refused there (the reply's error is `write_outside_scratch`, nothing changed); the
    parent compiles only a well-formed report of names and sources."""
    plant = f"open({str(world.cache / 'build' / OTHER_ENTRY[:2] / OTHER_ENTRY / 'kernel.so')!r}, 'wb').write(b'x')"
    source = CANDIDATE.format(source=KERNEL, extra=plant)
    before = world.state()
    reply = service.build(source, replace(world.config, guard=False))
    assert not reply["ok"] and reply["error"]["kind"] == "write_outside_scratch", reply
    assert world.state() == before
    for data in ({"kernels": "x"}, {"kernels": [{"name": "k", "source": 3}]}, {"kernels": [{}] * 65}):
        built = confine.build_reported({"ok": True, "data": data}, world.config.runtime, 60.0)
        assert not built["ok"] and built["error"]["kind"] == "worker_protocol"


CONFINED_WORKER = r"""
import json, sys
from pathlib import Path
from cutegen.config import RuntimeConfig
from cutegen.evaluate.confine import scratch_runtime
from cutegen.evaluate.runner import import_and_build
from cutegen.runtime import build_library, find_kernels
cache, scratch, candidate, missing = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
runtime = RuntimeConfig(cache_dir=cache, arch="sm_90a")
module, kernels = import_and_build(candidate, runtime)  # as the GPU worker does: guarded, confined, built
try:
    open(cache / "planted", "w")
    refused = False
except PermissionError:
    refused = True
built = build_library(missing, scratch_runtime(runtime, scratch))
print(json.dumps({"found": {"cached": kernels[0]["cached"], "library": str(find_kernels(module)[0].build_result.library_path)},
                  "built": {"cached": built.cached, "library": str(built.library_path)}, "refused": refused}))
"""


@landlock
@pytest.mark.nvcc
@needs_nvcc
def test_a_build_by_the_evaluator_is_found_by_a_confined_worker(world, service, tmp_path):
    """The evaluator builds the kernel the confined build worker reported into the shared cache; a GPU
    worker's import (runner.import_and_build: the hook, the confinement, the shared cache read) finds
    that build there, a kernel missing from the cache is built in its scratch directory (uncached),
    the worker cannot write the cache, and the cache is unchanged by it."""
    runtime = RuntimeConfig(cache_dir=world.cache / "build", arch="sm_90a")
    config = replace(world.config, runtime=runtime)
    candidate = CANDIDATE.format(source=KERNEL, extra="")
    reply = service.build(candidate, config)
    assert reply["ok"], reply
    (kernel,) = reply["data"]["kernels"]
    assert kernel["name"] == "scale" and kernel["cached"] is False and kernel["compile_s"] > 0
    library = world.cache / "build" / kernel["key"][:2] / kernel["key"] / "kernel.so"
    assert library.is_file()
    cache_before = _tree(world.cache)
    scratch = tmp_path / "worker"
    scratch.mkdir()
    missing = KERNEL.replace("x[i] * s", "x[i] * s + 1.0f")
    probe = subprocess.run([sys.executable, "-c", CONFINED_WORKER, str(world.cache / "build"), str(scratch), candidate,
                            missing], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": str(REPO / "src"), "TMPDIR": str(scratch)}, cwd=scratch)
    assert probe.returncode == 0, probe.stderr[-2000:]
    seen = json.loads(probe.stdout)
    assert seen["found"] == {"cached": True, "library": str(library)}
    assert seen["built"]["cached"] is False and seen["built"]["library"].startswith(str(scratch / "build"))
    assert seen["refused"] is True
    assert _tree(world.cache) == cache_before


@pytest.mark.nvcc
@needs_nvcc
def test_a_compile_error_in_the_evaluators_build_is_the_candidates_build_error(world, service):
    """nvcc's rejection of a reported source is judged as before the build moved out of the worker: a
    conclusive `build_error` with the compiler's first error, and no entry in the cache."""
    broken = KERNEL.replace("y[i] = x[i] * s;", "y[i] = x[i] * undefined_tile;")
    config = replace(world.config, runtime=RuntimeConfig(cache_dir=world.cache / "build", arch="sm_90a"))
    before = world.state()
    reply = service.build(CANDIDATE.format(source=broken, extra=""), config)
    assert not reply["ok"] and reply["conclusive"] and reply["error"]["kind"] == "build_error", reply
    assert "undefined_tile" in reply["error"]["distilled"]
    assert not [k for k in _tree(world.cache) if k.endswith("kernel.so") and k not in before["cache"]]


def test_a_workers_runtime_reads_the_shared_cache_and_builds_in_its_scratch_directory(tmp_path):
    runtime = RuntimeConfig(cache_dir=tmp_path / "cache" / "build")
    worker = confine.scratch_runtime(runtime, tmp_path / "scratch")
    assert (worker.shared_cache_dir, worker.cache_dir) == (tmp_path / "cache" / "build", tmp_path / "scratch" / "build")
    assert confine.scratch_runtime(worker, tmp_path / "other") == worker
    own = confine.candidate_folder(worker, "source")
    assert own == tmp_path / "cache" / "candidates" / hashlib.sha256(b"source").hexdigest()[:32]
    assert own == confine.candidate_folder(runtime, "source")


def test_the_fixture_world_helpers_are_not_vacuous(tmp_path):
    """`_tree` sees a changed byte and a new file (the unchanged-state assertions above rest on it)."""
    (tmp_path / "a").write_text("1")
    before = _tree(tmp_path)
    (tmp_path / "a").write_text("2")
    assert _tree(tmp_path) != before
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("")
    assert _tree(tmp_path) != before and set(_tree(tmp_path)) == {"a", "b"}

