"""The worker's audit hook (src/cutegen/evaluate/guard.py) on CPU.

Through the worker: every guard fixture is rejected as guard_refused naming the event its exploit
needs, and the honest twins pass (timing on). In a process of its own (an audit hook cannot be
removed): who asked decides, not the name of the call: trusted code may do on the candidate's behalf
what the candidate may not do itself, disguised routes and code the candidate compiled or wrote stay
the candidate's, and honest uses of inspect, gc, namedtuple, warnings, logging and traceback pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from cutegen.config import EvalConfig
from cutegen.evaluate import guard
from cutegen.evaluate.pipeline import evaluate_candidate
from cutegen.evaluate.service import Evaluator
from cutegen.tasks import load_task

from helpers import header, task_path

REPO = Path(__file__).resolve().parents[1]
CHEATS = REPO / "tests" / "fixtures" / "cheats"
HONEST = REPO / "tests" / "fixtures" / "honest"

# Each torch-backend guard fixture and the refusal its exploit runs into first (event: what).
REFUSED_EVENT = {
    "42_signal_frame.py": "signal: a signal handler",
    "43_exec_hook_heap.py": "gc.get_objects: heap walk",
    "44_profile_helper_module.py": "sys.setprofile: tracing",
    "45_ctypes_as_torch.py": "compile: code compiled under a trusted file's name",
    "46_proc_self_mem.py": "open: process memory",
    "47_thread_steals_nonce.py": "start_new_thread: thread creation",
    "48_own_audit_hook.py": "sys.addaudithook: tracing",
    "60_frame_walk_disguised.py": "sys._getframe: frame access",
    "61_traceback_frame.py": "object.__getattr__: frame access",
    "62_heap_referrers.py": "gc.get_referrers: heap walk",
    "63_settrace_judge.py": "sys.settrace: tracing",
    "64_ctypes_memory.py": "ctypes.string_at: ctypes",
    "65_replace_judge_code.py": "object.__setattr__: code replacement",
    "66_spawn_disguised.py": "os.posix_spawn: process creation",
    "67_write_installed_package.py": "open: a write outside the scratch directory",
}


def test_every_torch_guard_fixture_names_its_event():
    guarded = {p.name for p in CHEATS.glob("[0-9][0-9]_*.py")
               if header(p)["caught-by"] == "guard_refused" and header(p)["backend"] == "torch"}
    assert guarded == set(REFUSED_EVENT)


@pytest.fixture(scope="module")
def service():
    with Evaluator("cpu") as shared:
        yield shared


@pytest.fixture()
def config(tmp_path):
    return EvalConfig(device="cpu", backend="torch", do_timing=False, cache_dir=tmp_path / "eval", run_timeout_s=120.0,
                      correctness_trials=1, adversarial_trials=1, weight_seeds=1)


@pytest.mark.parametrize("name", sorted(REFUSED_EVENT))
def test_guard_fixture_is_refused_through_the_worker_naming_the_event(name, service, config):
    path = CHEATS / name
    verdict = evaluate_candidate(path, load_task(task_path(path, REPO)), config, service)
    assert not verdict.passed and verdict.failure == "guard_refused", verdict.feedback
    assert REFUSED_EVENT[name] in verdict.feedback, verdict.feedback


@pytest.mark.parametrize("name", ["guard_twin.py", "guard_twin_stdlib.py"])
def test_honest_twin_passes_with_the_guard_and_timing(name, service, config):
    path = HONEST / name
    timed = replace(config, do_timing=True, timing_trials=20, warmup_trials=2, compile_baseline=False,
                    eager_baseline=False)
    verdict = evaluate_candidate(path, load_task(task_path(path, REPO)), timed, service)
    assert verdict.passed, verdict.feedback
    assert "guard_refused" not in {c.name for c in verdict.checks}


# ----------------------------------------------------------------- attribution, in a process of its own

# A module in a folder the guard is told to trust: it stands for cutegen.runtime, torch or any library.
TRUSTED_HELPER = '''
import ctypes
import gc
import subprocess
import sys
import threading


def walk():
    return len(gc.get_objects())


def call(function):
    return function()


def start_thread():
    done = []
    thread = threading.Thread(target=lambda: done.append(1))
    thread.start()
    thread.join()
    return done


def use_ctypes():
    return ctypes.string_at(id(1), 4)


def run_process():
    return subprocess.run(["true"]).returncode


def frame_name():
    return sys._getframe(0).f_code.co_name
'''

# The candidate: one function per route; h_ ones are honest.
CANDIDATE = '''
import builtins
import collections
import copy
import dataclasses
import enum
import gc
import importlib
import inspect
import logging
import marshal
import os
import sys
import traceback
import types
import typing
import warnings

import trusted_helper as helper

PAYLOAD = None  # bytes of a code object the judge made (set by the driver)


def getframe():
    return sys._getframe(1)


def getframe_disguised():
    return getattr(sys.modules["sy" + "s"], "_get" + "frame")(1)


def traceback_frame():
    try:
        raise ValueError
    except ValueError as err:
        return err.__traceback__.tb_frame


def generator_frame():
    def gen():
        yield 1
    return gen().gi_frame


def inspect_stack():
    return inspect.stack()


def inspect_currentframe():
    return inspect.currentframe()


def traceback_walk_stack():
    return list(traceback.walk_stack(None))


def logging_currentframe():
    return logging.currentframe()


def heap_objects():
    return gc.get_objects()


def heap_disguised():
    return getattr(builtins, "__import__")("g" + "c").get_referrers([])


def heap_from_sys_modules():
    return sys.modules.get("gc").get_referents([])


def heap_in_exec():
    exec("import gc\\ngc.get_objects()")


def heap_callback_from_exec_through_trusted():
    return helper.call(eval("lambda: __import__('gc').get_objects()"))


def heap_callback_through_trusted():
    return helper.call(lambda: gc.get_objects())


def heap_from_scratch_module():
    with open("scratch_helper.py", "w") as out:
        out.write("import gc\\n\\ndef walk():\\n    return gc.get_objects()\\n")
    sys.path.insert(0, os.getcwd())
    return importlib.import_module("scratch_helper").walk()


def compile_posing():
    return compile("x = 1", helper.__file__, "exec")


def compile_posing_bytes_name():
    return compile("x = 1", os.fsencode(helper.__file__), "exec")


def code_replace_posing():
    return getframe.__code__.replace(co_filename=helper.__file__)


def trusted_code_under_own_globals():
    return types.FunctionType(helper.walk.__code__, {"gc": gc, "len": len})()


def marshal_loads():
    return marshal.loads(PAYLOAD)


def settrace():
    sys.settrace(lambda *args: None)


def setprofile_disguised():
    vars(sys)["set" + "profile"](lambda *args: None)


def audit_hook():
    sys.addaudithook(lambda *args: None)


def ctypes_string_at():
    return sys.modules["c" + "types"].string_at(id(1), 4)


def ctypes_imported_directly():
    return importlib.import_module("_ctypes").dlopen(None)


def system():
    return os.system("true")


def posix_spawn():
    return getattr(os, "posix_" + "spawn")("/bin/true", ["true"], {})


def thread():
    import threading
    threading.Thread(target=lambda: None).start()


def thread_raw():
    sys.modules["_thr" + "ead"].start_new_thread(lambda: None, ())


def thread_fresh_module():
    saved = sys.modules.pop("_thread")
    try:
        return importlib.import_module("_thread").start_new_thread
    finally:
        sys.modules["_thread"] = saved


def signal_handler():
    native = sys.modules["_sig" + "nal"]
    native.signal(native.SIGUSR2, lambda signum, frame: None)


def signal_fresh_module():
    import _imp
    import importlib.machinery
    return _imp.create_builtin(importlib.machinery.ModuleSpec("_signal", None, origin="built-in")).signal


def process_memory():
    return open("/" + "proc/self/mem", "rb")


def socket_new():
    import socket
    return socket.socket()


def write_outside():
    open(os.path.join(os.path.dirname(helper.__file__), "planted.txt"), "w")


def rename_outside():
    with open("mine.txt", "w") as out:
        out.write("x")
    os.rename("mine.txt", os.path.join(os.path.dirname(helper.__file__), "planted.txt"))


def replace_code():
    helper.walk.__code__ = getframe.__code__


def replace_defaults():
    helper.call.__defaults__ = (None,)


def threading_hook():
    import threading
    threading.settrace(lambda *args: None)  # installed by threading's bootstrap in the next thread
    try:
        return helper.start_thread()  # trusted code starts it
    finally:
        threading.settrace(None)


def gc_save_all():
    gc.set_debug(gc.DEBUG_SAVEALL)  # raises no event: seen by the next read of the record


def caught_refusal():
    try:
        gc.get_objects()
    except RuntimeError:
        pass
    from cutegen.evaluate import guard
    guard.findings().clear()  # a copy: the record is out of reach


def h_gc_collect():
    return gc.collect()


def h_signature():
    return list(inspect.signature(getframe).parameters)


def h_namedtuple():
    return collections.namedtuple("Pair", "a b")(1, 2)


def h_dataclass():
    return dataclasses.make_dataclass("Plan", ["rows"])(1)


def h_enum():
    return enum.Enum("Mode", "FAST SAFE").FAST


def h_typing():
    return typing.NamedTuple("Shape", [("rows", int)])(1)


def h_type_hints():
    def f(x: "int") -> "list[int]":
        return [x]
    return typing.get_type_hints(f)


def h_warning():
    warnings.warn("an honest warning", stacklevel=2)


def h_logging_exception():
    try:
        raise KeyError("k")
    except KeyError:
        logging.getLogger("candidate").exception("recovered")


def h_format_exc():
    try:
        raise KeyError("k")
    except KeyError:
        return traceback.format_exc()


def h_extract_stack():
    return len(traceback.extract_stack())


def h_deepcopy():
    return copy.deepcopy({"a": [1, 2]})


def h_write_scratch():
    with open("notes.txt", "w") as out:
        out.write("x")


def h_import_fresh_stdlib():
    return importlib.import_module("colorsys").rgb_to_hsv(0.1, 0.2, 0.3)


def h_trusted_heap_walk():
    return helper.walk()


def h_trusted_thread():
    return helper.start_thread()


def h_trusted_ctypes():
    return helper.use_ctypes()


def h_trusted_process():
    return helper.run_process()


def h_trusted_frame():
    return helper.frame_name()
'''

# The judge's side: runs each route of the candidate and reports what happened, then the record.
DRIVER = '''
import importlib.util
import json
import marshal
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from cutegen.evaluate import guard

scratch = sys.argv[1]
os.chdir(scratch)
read = guard.install(os.path.join(scratch, "candidate.py"), scratch, trusted=[os.path.dirname(__file__)])
sys.dont_write_bytecode = False  # the candidate's imports would cache bytecode beside trusted modules
spec = importlib.util.spec_from_file_location("candidate", os.path.join(scratch, "candidate.py"))
candidate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(candidate)
candidate.PAYLOAD = marshal.dumps(compile("x = 1", __file__, "exec"))
outcomes = {}
for name in sys.argv[2:]:
    before = len(read())
    try:
        getattr(candidate, name)()
        outcome = "ok"
    except guard.GuardRefused as err:
        outcome = "refused: " + str(err).split(": ", 1)[1]
    except Exception as err:
        outcome = f"error: {type(err).__name__}: {err}"
    recorded = read()[before:]
    if outcome == "ok" and recorded:
        outcome = "recorded: " + recorded[0]
    outcomes[name] = outcome
outcomes["_findings"] = read()
from cutegen.evaluate import protocol  # the worker's dispatch, after the candidate was refused something

reply = protocol.run_command({"role": "candidate", "session": object()}, "weights", None)
outcomes["_next_command"] = [reply["ok"], reply.get("error", {}).get("kind"), reply.get("error", {}).get("message")]
print(json.dumps(outcomes))
'''

REFUSED = {
    "getframe": "sys._getframe: frame access",
    "getframe_disguised": "sys._getframe: frame access",
    "traceback_frame": "object.__getattr__: frame access",
    "generator_frame": "object.__getattr__: frame access",
    "inspect_stack": "sys._getframe: frame access",
    "inspect_currentframe": "sys._getframe: frame access",
    "traceback_walk_stack": "sys._getframe: frame access",
    "logging_currentframe": "sys._getframe: frame access",
    "heap_objects": "gc.get_objects: heap walk",
    "heap_disguised": "gc.get_referrers: heap walk",
    "heap_from_sys_modules": "gc.get_referents: heap walk",
    "heap_in_exec": "gc.get_objects: heap walk",
    "heap_callback_from_exec_through_trusted": "gc.get_objects: heap walk",
    "heap_callback_through_trusted": "gc.get_objects: heap walk",
    "heap_from_scratch_module": "gc.get_objects: heap walk",
    "compile_posing": "compile: code compiled under a trusted file's name",
    "compile_posing_bytes_name": "compile: code compiled under a trusted file's name",
    "code_replace_posing": "code.__new__: a code object named after a trusted file",
    "trusted_code_under_own_globals": "function.__new__: a trusted module's or function's code",
    "marshal_loads": "marshal.loads: code loaded from bytes",
    "settrace": "sys.settrace: tracing",
    "setprofile_disguised": "sys.setprofile: tracing",
    "ctypes_string_at": "ctypes.string_at: ctypes",
    "ctypes_imported_directly": "ctypes.dlopen: ctypes",
    "system": "os.system: process creation",
    "posix_spawn": "os.posix_spawn: process creation",
    "thread": "start_new_thread: thread creation",
    "thread_raw": "start_new_thread: thread creation",
    "thread_fresh_module": "create_builtin: a fresh copy of a guarded module",
    "signal_handler": "signal: a signal handler",
    "signal_fresh_module": "create_builtin: a fresh copy of a guarded module",
    "process_memory": "open: process memory",
    "socket_new": "socket.__new__: a socket",
    "write_outside": "open: a write outside the scratch directory",
    "rename_outside": "os.rename: a change outside the scratch directory",
    "replace_code": "object.__setattr__: code replacement",
    "replace_defaults": "object.__setattr__: a trusted function's defaults",
}
# Refused where the interpreter swallows the refusal (a new audit hook is dropped without an error) or
# the candidate catches it: the record keeps it.
RECORDED = {"audit_hook": "sys.addaudithook: tracing", "caught_refusal": "gc.get_objects: heap walk",
            "threading_hook": "sys.settrace: tracing (a threading hook)",
            "gc_save_all": "gc.set_debug(DEBUG_SAVEALL): heap walk"}
HONEST_ROUTES = ["h_gc_collect", "h_signature", "h_namedtuple", "h_dataclass", "h_enum", "h_typing", "h_type_hints",
                 "h_warning", "h_logging_exception", "h_format_exc", "h_extract_stack", "h_deepcopy",
                 "h_write_scratch", "h_import_fresh_stdlib", "h_trusted_heap_walk", "h_trusted_thread",
                 "h_trusted_ctypes", "h_trusted_process", "h_trusted_frame"]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard")
    trusted, scratch = root / "trusted", root / "scratch"
    trusted.mkdir()
    scratch.mkdir()
    (trusted / "trusted_helper.py").write_text(textwrap.dedent(TRUSTED_HELPER))
    (trusted / "driver.py").write_text(textwrap.dedent(DRIVER))
    (scratch / "candidate.py").write_text(textwrap.dedent(CANDIDATE))
    routes = [*REFUSED, *RECORDED, *HONEST_ROUTES]
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, str(trusted / "driver.py"), str(scratch), *routes], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["_trusted"] = str(trusted)
    return found


@pytest.mark.parametrize("route", sorted(REFUSED))
def test_candidate_route_is_refused_naming_the_event(route, outcomes):
    assert outcomes[route].startswith("refused: " + REFUSED[route]), outcomes[route]


@pytest.mark.parametrize("route", sorted(RECORDED))
def test_a_refusal_the_candidate_does_not_see_is_recorded(route, outcomes):
    assert outcomes[route].startswith("recorded: " + RECORDED[route]), outcomes[route]


@pytest.mark.parametrize("route", HONEST_ROUTES)
def test_honest_and_trusted_on_behalf_routes_pass(route, outcomes):
    assert outcomes[route] == "ok", outcomes[route]


def test_every_refusal_is_in_the_record_and_nothing_was_planted(outcomes):
    record = outcomes["_findings"]
    assert len(record) == len(REFUSED) + len(RECORDED)
    for expected in [*REFUSED.values(), *RECORDED.values()]:
        assert any(entry.startswith(expected) for entry in record), expected
    assert not (Path(outcomes["_trusted"]) / "planted.txt").exists()


def test_once_refused_the_candidate_is_not_run_again(outcomes):
    """A candidate that caught its refusal gains no further call: the worker answers the next candidate
    command (here `weights`, whose session would build the model) with the refusal, unrun."""
    ok, kind, message = outcomes["_next_command"]
    assert not ok and kind == "guard_refused"
    assert message.endswith("(the candidate is not run again)") and outcomes["_findings"][0] in message


def test_bytecode_caches_of_trusted_modules_are_refused_quietly(outcomes):
    """The candidate imported the trusted helper with bytecode caching on: importlib's cache folder and
    file beside it are refused as the OS would refuse them (the import goes on, nothing is recorded);
    its own module's cache, in its scratch directory, is written."""
    assert not (Path(outcomes["_trusted"]) / "__pycache__").exists()
    assert outcomes["h_gc_collect"] == "ok"  # the candidate's import went through
    assert list((Path(outcomes["_trusted"]).parent / "scratch" / "__pycache__").glob("candidate.*.pyc"))


# ------------------------------------------------------------------------ places and origins, in process


def test_location_judges_code_by_where_it_lives(tmp_path):
    where = guard.places(tmp_path, trusted=[tmp_path / "lib"])
    assert guard.location("<frozen importlib._bootstrap>", where) == guard.STDLIB
    assert guard.location("<string>", where) == guard.GENERATED
    assert guard.location(json.__file__, where) == guard.STDLIB
    assert guard.location(pytest.__file__, where) == guard.TRUSTED  # a site folder
    assert guard.location(str(tmp_path / "lib" / "m.py"), where) == guard.TRUSTED
    assert guard.location(guard.__file__, where) == guard.STDLIB  # its replacements act for their caller
    assert guard.location(str(REPO / "src" / "cutegen" / "evaluate" / "timing.py"), where) == guard.TRUSTED
    assert guard.location(str(tmp_path / "candidate.py"), where) == guard.CANDIDATE
    assert guard.location("candidate.py", where) == guard.CANDIDATE


def test_origins_tell_equal_code_apart_by_identity(tmp_path):
    """Code objects compare equal across file names: a copy of trusted code compiled under the
    candidate's name must not share the trusted one's origin."""
    where = guard.places(tmp_path)
    origins = guard.Origins(where)
    library = compile("def f():\n    return 1\n", json.__file__, "exec").co_consts[0]
    copied = compile("def f():\n    return 1\n", str(tmp_path / "c.py"), "exec").co_consts[0]
    assert library == copied
    assert origins.of(library) == guard.STDLIB and origins.of(copied) == guard.CANDIDATE
    origins.mark(compile("def g():\n    return lambda: 2\n", "<string>", "exec"))
    assert origins.of(copied) == guard.CANDIDATE


def test_import_folders_are_the_paths_folders_that_hold_nothing_of_the_candidates(tmp_path, monkeypatch):
    """sys.path's folders outside the site folders (a PYTHONPATH install folder, a distribution's
    dist-packages) hold installed code; a folder that holds the scratch directory, the candidate's file
    or the working directory, or lies inside one, is not among them (its code would be trusted)."""
    lib, outer, work = tmp_path / "dist-packages", tmp_path / "outer", tmp_path / "work"
    scratch, home = outer / "scratch", tmp_path / "candidates"
    for folder in (lib, scratch, work, home):
        folder.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", ["", str(lib), str(outer), str(scratch), str(home), str(work),
                                      str(tmp_path / "missing"), str(tmp_path / "python3.zip")])
    assert guard.import_folders(scratch, home / "candidate.py") == [str(lib) + os.sep]
    where = guard.places(scratch, candidate_file=home / "candidate.py")
    assert guard.location(str(lib / "setuptools" / "__init__.py"), where) == guard.TRUSTED
    assert guard.location(str(outer / "helper.py"), where) == guard.CANDIDATE
    assert guard.location(str(home / "candidate.py"), where) == guard.CANDIDATE


def test_installed_code_on_pythonpath_acts_as_trusted_and_a_folder_added_later_does_not(tmp_path):
    """Setuptools' distutils finder, installed in a folder that was only on PYTHONPATH, read frames and
    changed a class's bases when torch's extension builder imported it for a `load_inline` candidate;
    counted as the candidate's, that failed every such import on the H200. Now such a folder's code
    acts as trusted, while the same module in the candidate's scratch directory, or in a folder the
    candidate puts on sys.path, stays the candidate's."""
    lib, later, scratch = tmp_path / "installed", tmp_path / "later", tmp_path / "scratch"
    for folder in (lib, later, scratch):
        folder.mkdir()
    library = "import sys\nFRAME = sys._getframe(0).f_code.co_name\n"
    (lib / "installed_lib.py").write_text(library)
    (later / "later_lib.py").write_text(library)
    (scratch / "own_lib.py").write_text(library)
    (scratch / "candidate.py").write_text(textwrap.dedent(f"""
        import sys
        results = {{}}
        for name in ("installed_lib", "own_lib", "later_lib"):
            if name == "later_lib":
                sys.path.append({str(later)!r})
            try:
                __import__(name)
                results[name] = "ok"
            except Exception as err:
                results[name] = type(err).__name__
    """))
    candidate = str(scratch / "candidate.py")
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        from cutegen.evaluate import guard
        findings = guard.install({candidate!r}, {str(scratch)!r})
        sys.path.insert(0, {str(scratch)!r})  # the candidate's own helper modules, as a worker finds them
        spec = importlib.util.spec_from_file_location("candidate", {candidate!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(json.dumps({{"results": module.results, "findings": findings()}}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lib), str(REPO / "src")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=scratch, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["results"] == {"installed_lib": "ok", "own_lib": "GuardRefused", "later_lib": "GuardRefused"}
    assert len(out["findings"]) == 2 and all("sys._getframe: frame access" in f for f in out["findings"])


def test_install_refuses_a_candidate_among_trusted_code(tmp_path):
    with pytest.raises(ValueError, match="among trusted code"):
        guard.install(REPO / "src" / "cutegen" / "candidate.py", tmp_path)


# ------------------------------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
def test_a_cute_kernel_launch_raises_no_audit_event_under_the_guard(tmp_path):
    """Kernel launches go through ctypes from cutegen.runtime: a foreign call raises no audit event in
    this Python, so the hook adds nothing to a launch (bench/guard_cost.py --cuda measures it)."""
    script = textwrap.dedent(f'''
        import importlib.util, sys
        import torch
        from cutegen.evaluate import guard
        guard.install({str(tmp_path / "candidate.py")!r}, {str(tmp_path)!r})
        spec = importlib.util.spec_from_file_location("twin", {str(HONEST / "cute_swish_scale.py")!r})
        twin = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(twin)
        model, x = twin.ModelNew(2.0), torch.randn(4096, device="cuda")
        model(x)
        events = []
        sys.addaudithook(lambda event, args: events.append(event))
        for _ in range(100):
            out = model(x)
        torch.cuda.synchronize()
        assert torch.allclose(out, x * torch.sigmoid(x) * 2.0, atol=1e-5)
        print(len([e for e in events if e.startswith("ctypes.")]), guard.findings())
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] == "0" and done.stdout.strip().endswith("[]"), done.stdout


def test_a_signal_handler_set_past_the_replacement_is_found_once(tmp_path):
    """The backstop behind the replaced signal function: a handler of candidate code in the handler
    table is recorded at the next read (once), whichever copy of signal set it."""
    import signal

    judge = guard.Judge(guard.places(tmp_path), {})
    space: dict = {}
    exec(compile("def spy(signum, frame):\n    pass\n", str(tmp_path / "candidate.py"), "exec"), space)
    before = signal.signal(signal.SIGUSR2, space["spy"])
    try:
        expected = f"signal {int(signal.SIGUSR2)}: a signal handler (it is called with the interrupted frame)"
        assert judge.findings() == [expected]
        assert judge.findings() == [expected]
    finally:
        signal.signal(signal.SIGUSR2, before)
