"""Nothing a candidate runs writes outside its worker's scratch directory (EVALUATION.md, "Isolation";
issue property 4: "nothing written outside the worker's scratch directory").

Defeats a candidate that writes where a later process will read and run it: appending to an installed
package's `__init__.py` (site-packages/torch/__init__.py runs in every later process that imports
torch; seen on the H200), planting a `.pth` file or a module that shadows one, a `.pyc` whose header
matches the untouched source, a library in another build's entry of the shared build cache (every
later candidate that declares that source loads it), another candidate's extension folder, the run
directory or the evaluator's caches of baselines and probes. Three layers:

1. Landlock (Linux 5.13+), applied by `confine` in each worker that runs a candidate (the build
   pool's, the GPU's) right before the candidate's import: from then on nothing in that process, its
   native code and every child it starts included, can create, write, truncate, rename, link or
   remove a file outside its scratch directory (its cwd, also its TMPDIR), /dev (device nodes are
   opened read-write; /dev/shm), /proc (threads name themselves there; Landlock keeps the process
   from reaching other processes' memory) and the candidate's own build folder (`candidate_folder`).
   A refused write fails with EACCES; the worker reports it and the verdict names
   `write_outside_scratch`. Rights the kernel's ABI does not know are left out (truncation needs
   ABI 3; ioctl on devices, ABI 5, is not restricted: GPUs need it). It cannot be undone, which suits
   a worker that serves one candidate.
2. Only trusted code writes the shared build cache: the build pool's confined worker imports the
   candidate and reports its kernels' sources (data, over the channel); the evaluator compiles them
   into the cache itself (`build_reported`: nvcc as a plain subprocess, no candidate Python in the
   process). The candidate's GPU worker reads the cache (`RuntimeConfig.shared_cache_dir`) and builds
   what it lacks in its scratch directory, uncached. A `load_inline` candidate builds into its own
   folder, keyed by the sha256 of its source, which only that candidate's workers may write; its GPU
   worker finds there what its build worker compiled.
3. Where Landlock is missing (another OS, an old or restricted kernel), or has no truncation right
   (ABI < 3), or `EvalConfig.confinement` is "hashes": an `EnvironmentSeal` of what the judge
   imports (size, mtime, ctime and, for text, the sha256 of each module file loaded in the
   evaluating process and of the .pyc its import uses, the site folders' .pth files, the listings of
   the site folders and of the folder holding cutegen) is compared in the parent after each
   candidate. ctime cannot be set back from user space, so restoring a file's mtime hides nothing. A
   change fails that evaluation with `write_outside_scratch`, naming the file, and marks the
   environment poisoned (a file in the eval cache): every later evaluation refuses to run
   (EnvironmentPoisoned), with the fix (reinstall, then delete the mark).

Not defended: reads (a candidate may read any file its user can; the judge's secrets are the seeds
the parent draws for each call, in no file); writes inside the allowed places (its scratch, /dev/shm,
its own build folder; nothing trusted runs from them); metadata (chmod, utime and ownership are not
Landlock rights: a candidate can make its user's files unreadable, which breaks later runs loudly but
runs nothing); signals to the user's other processes where the kernel's Landlock is older than ABI 6
(from ABI 6 on, a confined worker cannot signal any process outside its own tree: not the evaluator,
its fork server or another candidate's worker), and the /proc files of theirs that need no ptrace access; what the compilers of a candidate's kernels read (they run unconfined in the
evaluator, and read any file the source `#include`s, as the candidate could). Where only the seal
stands (no Landlock): writes to the build cache, the run directory and the evaluator's caches (the
seal covers what the judge imports, not those), a .pyc created where none was (pip compiles them at
install, so one exists for every installed module), a module file that the evaluating process had
not loaded when the candidate ran, and what a process the candidate started with a double fork does
after the comparison. Evaluations that run at once share one seal: a change is blamed on the
evaluation that ends first, and every later one refuses.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import site
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError, ConfigError, CutegenError, ToolchainError
from cutegen.evaluate.failure import describe_error
from cutegen.evaluate.verdict import Stop
from cutegen.records import CheckResult
from cutegen.runtime import build_library

# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the same numbers on x86_64 and arm64.
_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# LANDLOCK_ACCESS_FS_* that change the file system, by the ABI that introduced them. Reads (EXECUTE,
# READ_FILE, READ_DIR) are left unhandled, hence allowed everywhere; so is IOCTL_DEV (ABI 5).
WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << n for n in range(6, 13))
REFER, TRUNCATE = 1 << 13, 1 << 14
_RIGHTS_BY_ABI = {
    1: WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK
    | MAKE_SYM,
    2: REFER,  # renaming and linking across folders
    3: TRUNCATE,  # truncate(2) and open(O_TRUNC): before ABI 3 a path could be truncated anywhere
}
# LANDLOCK_SCOPE_SIGNAL (ABI 6, Linux 6.12): no signal to a process outside the worker's own domain,
# that is, not to the evaluator, its fork server or another candidate's worker (a stopped fork server
# stalls every build worker it would start); its own children stay reachable.
SCOPE_SIGNAL, SCOPE_ABI = 1 << 1, 6
ALWAYS_WRITABLE = ("/dev", "/proc")
CANDIDATES_FOLDER = "candidates"  # beside the build cache: <cache root>/candidates/<sha256 of the source>/
POISON_MARK = "environment-poisoned.json"  # in EvalConfig.cache_dir
MAX_REPORTED_KERNELS = 64
MAX_REPORTED_SOURCE_CHARS = 4 << 20


class ConfinementError(ToolchainError):
    """The kernel has Landlock but restricting a worker failed (an infrastructure problem, not the
    candidate's)."""


class EnvironmentPoisoned(CutegenError):
    """A file the judge imports was changed while a candidate ran, on a machine without Landlock."""


# ------------------------------------------------------------------------------------------ Landlock


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (another OS, a kernel before 5.13, or
    Landlock left out of the kernel's LSM list)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def write_rights(abi: int) -> int:
    """The write rights Landlock handles at `abi` (the rights of later ABIs masked out: an older
    kernel refuses a ruleset naming rights it does not know)."""
    rights = 0
    for version, bits in _RIGHTS_BY_ABI.items():
        if abi >= version:
            rights |= bits
    return rights


class _RulesetAttr(ctypes.Structure):
    # handled_access_net (ABI 4) is left 0: the network is not restricted; scoped came with ABI 6.
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Confinement:
    """What `confine` put in force: the kernel's Landlock ABI (0: none), whether writes are now
    restricted, and the folders where they are still allowed."""

    landlock_abi: int
    enforced: bool
    writable: tuple[str, ...]
    signals_scoped: bool = False  # no signal to a process outside its own tree (Landlock ABI 6 and later)


def confine(scratch: str | Path, writable: Iterable[str | Path] = (), *, enforce: bool = True) -> Confinement:
    """Forbid this process, and every process it starts, each change to the file system outside
    `scratch`, /dev, /proc and `writable` (folders that exist). Irreversible. Without Landlock, or
    with `enforce` False, nothing changes (`enforced` False: the parent's seal stands in). Raises
    ConfinementError where Landlock is present and refuses."""
    abi = landlock_abi()
    roots = tuple(dict.fromkeys(str(Path(p).resolve()) for p in (scratch, *ALWAYS_WRITABLE, *writable)
                                if p and Path(p).is_dir()))
    if not enforce or abi == 0:
        return Confinement(abi, False, roots)
    libc = ctypes.CDLL(None, use_errno=True)
    rights = write_rights(abi)
    scoped = abi >= SCOPE_ABI
    attr = _RulesetAttr(rights, 0, SCOPE_SIGNAL if scoped else 0)
    # An older kernel knows a shorter structure, and refuses a longer one: pass what its ABI reads.
    size = ctypes.sizeof(attr) if scoped else ctypes.sizeof(ctypes.c_uint64)
    ruleset = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _refused("landlock_create_ruleset", abi)
    try:
        for root in roots:
            fd = os.open(root, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights, fd)
                if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise _refused(f"landlock_add_rule({root})", abi)
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _refused("prctl(PR_SET_NO_NEW_PRIVS)", abi)
        if libc.syscall(_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _refused("landlock_restrict_self", abi)
    finally:
        os.close(ruleset)
    return Confinement(abi, True, roots, scoped)


def _refused(call: str, abi: int) -> ConfinementError:
    err = ctypes.get_errno()
    return ConfinementError(f"The kernel has Landlock (ABI {abi}) but {call} failed: {os.strerror(err)}.",
                            "Allow the landlock syscalls (a container's seccomp profile may block them), or"
                            " evaluate with EvalConfig.confinement = \"hashes\" (the hash seal alone).")


# ----------------------------------------------------------------------- the candidate's build folders


def candidate_folder(runtime: RuntimeConfig, source: str) -> Path:
    """The candidate's own build folder (torch's extensions, for `load_inline`), beside the shared
    build cache and keyed by the sha256 of its source: its build worker and its GPU worker write
    there, no other candidate's worker may."""
    root = Path(runtime.shared_cache_dir or runtime.cache_dir).expanduser()
    return root.parent / CANDIDATES_FOLDER / hashlib.sha256(source.encode("utf-8")).hexdigest()[:32]


def scratch_runtime(runtime: RuntimeConfig, scratch: Path) -> RuntimeConfig:
    """The runtime settings of a candidate's worker: the evaluator's build cache read
    (`shared_cache_dir`), new builds in the scratch directory (uncached: the worker cannot write the
    shared cache). Unchanged when it already reads a shared cache."""
    if runtime.shared_cache_dir is not None:
        return runtime
    return replace(runtime, cache_dir=Path(scratch) / "build", shared_cache_dir=Path(runtime.cache_dir).expanduser())


def builds_torch_extension(source: str) -> bool:
    """Whether a candidate names torch's extension builder (load_inline, cpp_extension), which builds
    when the candidate is imported."""
    return "load_inline" in source or "cpp_extension" in source


def confine_candidate(source: str, runtime: RuntimeConfig, scratch: Path, enforce: bool = True) -> Confinement:
    """Right before the candidate's import: point the JIT caches a candidate may use at folders it
    may write (torch's extensions at its own build folder when it names load_inline; Triton's,
    inductor's and torch's kernel cache in its scratch directory), make them, then `confine`."""
    scratch = Path(scratch)
    own = candidate_folder(runtime, source)
    extensions = own / "torch_extensions" if builds_torch_extension(source) else scratch / "torch_extensions"
    folders = {"TORCH_EXTENSIONS_DIR": extensions, "TRITON_CACHE_DIR": scratch / "triton",
               "TORCHINDUCTOR_CACHE_DIR": scratch / "inductor", "PYTORCH_KERNEL_CACHE_PATH": scratch / "kernels"}
    for name, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)  # a folder made after the confinement could not be allowed
        os.environ[name] = str(folder)
    return confine(scratch, [extensions], enforce=enforce)


# --------------------------------------------------------------------- builds by trusted code only


def reported_sources(data: Any) -> list[tuple[str, str]]:
    """(name, source) of each kernel a confined build worker reported; ValueError for a report that
    is not a bounded list of strings (the report comes from the candidate's process)."""
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, list) or len(kernels) > MAX_REPORTED_KERNELS:
        raise ValueError(f"the build worker's report holds no list of at most {MAX_REPORTED_KERNELS} kernels")
    found = []
    for kernel in kernels:
        name, source = (kernel.get("name"), kernel.get("source")) if isinstance(kernel, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(source, str) or len(source) > MAX_REPORTED_SOURCE_CHARS:
            raise ValueError("a kernel in the build worker's report is not a name and a source of bounded size")
        found.append((name[:200], source))
    return found


def build_reported(reply: dict[str, Any], runtime: RuntimeConfig, timeout_s: float) -> dict[str, Any]:
    """A confined build worker's reply (`prebuild`: the candidate imported, its kernels' sources
    reported) made into a build's reply: each source compiled here, by trusted code, into the
    shared build cache (runtime.build.build_library, nvcc as a plain subprocess). `timeout_s` bounds
    each nvcc run; one past it is a `build_timeout`, as a build worker killed at the timeout was.
    A failed or malformed reply comes back as a failure."""

    if not reply.get("ok"):
        return reply
    started = time.perf_counter()
    try:
        sources = reported_sources(reply.get("data"))
    except ValueError as err:
        return {"ok": False, "error": {"kind": "worker_protocol", "type": "ValueError", "message": str(err)}}
    runtime = replace(runtime, nvcc_timeout_s=min(runtime.nvcc_timeout_s, timeout_s), shared_cache_dir=None)
    kernels = []
    try:
        for name, source in sources:
            result = build_library(source, runtime)
            kernels.append({"name": name, "cached": result.cached, "compile_s": result.compile_s, "arch": result.arch,
                            "key": result.cache_key})
    except BuildError as err:
        if "nvcc timed out" in err.distilled:
            detail = f"nvcc was stopped at the build timeout (after {timeout_s:.3g} s of compiling)"
            return {"ok": False, "died": "build_timeout", "detail": detail,
                    "error": {"kind": "build_timeout", "message": detail}}
        return {"ok": False, "error": {**describe_error(err), "kind": "build_error"}}  # whatever nvcc's log says
    except (ToolchainError, ConfigError) as err:
        return {"ok": False, "error": describe_error(err)}
    return {**reply, "data": {"build_s": import_seconds(reply) + time.perf_counter() - started, "kernels": kernels}}


def import_seconds(reply: dict[str, Any]) -> float:
    """The seconds a build worker says the candidate's import took (0 for anything but a finite
    non-negative number: the candidate's process wrote it)."""
    data = reply.get("data")
    value = data.get("build_s") if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and 0.0 <= value < float("inf") else 0.0


# -------------------------------------------------------------------------- the seal (fallback)


@dataclass(frozen=True)
class FileStamp:
    """A file's state: size (-1: absent), mtime and ctime in ns (ctime cannot be set back from user
    space), and the sha256 of text files (None for binaries, judged by size and times)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    sha256: str | None


_HASHED_SUFFIXES = (".py", ".pyc", ".pth")


def stamp(path: str) -> FileStamp:
    try:
        info = os.stat(path)
    except OSError:
        return FileStamp(-1, 0, 0, None)
    digest = None
    if path.endswith(_HASHED_SUFFIXES):
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            digest = None
    return FileStamp(info.st_size, info.st_mtime_ns, info.st_ctime_ns, digest)


def _same(before: FileStamp, path: str) -> bool:
    """Whether `path` is as `before` recorded: untouched (size and both times), or rewritten with the
    same bytes (a text file's sha256)."""
    try:
        info = os.stat(path)
    except OSError:
        return before.size == -1
    if (info.st_size, info.st_mtime_ns, info.st_ctime_ns) == (before.size, before.mtime_ns, before.ctime_ns):
        return True
    return before.sha256 is not None and stamp(path).sha256 == before.sha256


def _module_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    return path if isinstance(path, str) and os.path.isabs(path) and os.path.isfile(path) else None


def _site_folders() -> list[str]:
    """The folders whose new entries later interpreters would import or run: the site folders (a
    new .pth or a shadowing module) and the folder holding cutegen (first on the workers' path)."""
    folders = list(getattr(site, "getsitepackages", list)()) + [site.getusersitepackages(),
                                                                 str(Path(__file__).resolve().parents[2])]
    return [str(Path(f).resolve()) for f in dict.fromkeys(folders) if os.path.isdir(f)]


@dataclass(frozen=True)
class _Sealed:
    module: str | None  # the module that loaded the file (None: a .pth), judged while it stays loaded
    source: str | None  # that module's __file__ (a .pyc's source)
    stamp: FileStamp


class EnvironmentSeal:
    """The state of what the judge's processes import, taken before candidates run and compared after
    each (the module docstring, layer 3). Thread-safe: evaluations run in several threads."""

    def __init__(self) -> None:
        self._files: dict[str, _Sealed] = {}
        self._listings: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def extend(self) -> None:
        """Seal what is not sealed yet: each module file loaded in this process and the .pyc its
        import would use (where one exists: pip compiles them at install), the site folders' .pth
        files and listings. Called before each candidate."""
        with self._lock:
            for name, module in list(sys.modules.items()):
                path = _module_file(module)
                if path is None or path in self._files:
                    continue
                self._files[path] = _Sealed(name, path, stamp(path))
                cached = importlib.util.cache_from_source(path) if path.endswith(".py") else ""
                if cached and os.path.isfile(cached):
                    self._files.setdefault(cached, _Sealed(name, path, stamp(cached)))
            for folder in _site_folders():
                if folder not in self._listings:
                    self._listings[folder] = frozenset(os.listdir(folder))
                    for entry in self._listings[folder]:
                        if entry.endswith(".pth"):
                            path = os.path.join(folder, entry)
                            self._files.setdefault(path, _Sealed(None, None, stamp(path)))

    def files(self) -> int:
        return len(self._files)

    def changes(self) -> list[str]:
        """What differs from the sealed state, one line per file or folder. A module this process
        itself unloaded is no longer judged (a candidate cannot unload the parent's modules)."""
        with self._lock:
            files, listings = dict(self._files), dict(self._listings)
        found = []
        for path, sealed in files.items():
            if sealed.module is not None and \
                    getattr(sys.modules.get(sealed.module), "__file__", None) != sealed.source:
                continue
            if not _same(sealed.stamp, path):
                now = stamp(path)
                what = "removed" if now.size == -1 else f"changed (size {sealed.stamp.size} -> {now.size} bytes)"
                found.append(f"{path}: {what}")
        for folder, names in listings.items():
            try:
                now = frozenset(os.listdir(folder))
            except OSError:
                now = frozenset()
            added, gone = sorted(now - names), sorted(names - now)
            if added or gone:
                parts = ([f"new {', '.join(added[:5])}"] if added else []) + ([f"gone {', '.join(gone[:5])}"] if gone else [])
                found.append(f"{folder}: {'; '.join(parts)}")
        return found


_SEAL: EnvironmentSeal | None = None
_SEAL_LOCK = threading.Lock()


def seal_needed(confinement: str) -> bool:
    """Whether the hashes must stand in for Landlock: asked for, no Landlock, or one that cannot
    refuse truncation (ABI < 3)."""
    return confinement == "hashes" or landlock_abi() < 3


def process_seal() -> EnvironmentSeal:
    """This process's seal, made at its first use (before the first candidate it judges runs)."""
    global _SEAL
    with _SEAL_LOCK:
        if _SEAL is None:
            _SEAL = EnvironmentSeal()
        return _SEAL


def poison_mark(cache_dir: Path) -> Path:
    return Path(cache_dir).expanduser() / POISON_MARK


def before_evaluation(config: Any) -> EnvironmentSeal | None:
    """Refuse to evaluate in a poisoned environment (EnvironmentPoisoned: the changed files and the
    fix); else the seal to compare after this candidate (None where Landlock confines the workers)."""
    mark = poison_mark(config.cache_dir)
    if mark.is_file():
        try:
            changed = json.loads(mark.read_text(encoding="utf-8")).get("changed", [])
        except (OSError, ValueError, AttributeError):
            changed = ["(the mark is unreadable)"]
        raise EnvironmentPoisoned(
            "A candidate changed files that the judge imports, on a machine where its workers were not"
            f" confined: {'; '.join(map(str, changed[:5]))}. Every later process that imports them could run the"
            " candidate's code, so no evaluation runs here until they are restored.",
            "Reinstall the packages those files belong to (e.g. `pip install --force-reinstall --no-deps torch`,"
            f" or the cutegen checkout), then delete {mark}.")
    if not seal_needed(config.confinement):
        return None
    seal = process_seal()
    seal.extend()
    return seal


def after_evaluation(run: Any, config: Any, seal: EnvironmentSeal | None) -> None:
    """After the candidate's processes ran (the parent): a passed `write_outside_scratch` check that
    says which layer held, or, where the seal finds a change, that check failed (the verdict's
    failure whatever came before) and the environment marked poisoned."""

    if run.stage == "static":
        return  # nothing of the candidate ran
    if seal is None:
        run.add(CheckResult("write_outside_scratch", run.stage, True, f"Landlock (ABI {landlock_abi()}) kept the"
                            " candidate's processes from writing outside their scratch directories"))
        return
    changed = seal.changes()
    if not changed:
        run.add(CheckResult("write_outside_scratch", run.stage, True,
                            f"hash seal: the {seal.files()} files the judge imports are unchanged"))
        return
    mark = poison_mark(config.cache_dir)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(json.dumps({"changed": changed, "candidate_sha256": run.base.get("candidate_sha256")}, indent=1),
                    encoding="utf-8")
    try:
        run.fail("write_outside_scratch", "While the candidate ran, files the judge imports changed (hash seal; no"
                 f" Landlock here): {'; '.join(changed[:5])}. A candidate may write only in its working directory;"
                 f" the environment is marked poisoned ({mark}) until they are reinstalled.")
    except Stop:
        pass
