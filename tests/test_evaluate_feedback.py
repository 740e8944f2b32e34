"""What a worker's failure becomes in the parent: the failure kind of an exception (classify_error),
the failure name and the feedback a model gets (error_failure, died_feedback, crash_line), and the
hashes saved runs depend on (a changed value makes every saved run miss its recorded replies,
verdicts or builds: change them only with a migration)."""

from __future__ import annotations

import pytest

from cutegen.errors import BuildError, ToolchainError
from cutegen.evaluate.failure import classify_error, describe_error
from cutegen.evaluate.verdict import crash_line, died_feedback, error_failure


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError, which classify_error recognises by name."""


@pytest.mark.parametrize("err, kind", [
    (MemoryError("host"), "out_of_memory"),
    (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out_of_memory"),
    (RuntimeError("CUDA error: out of memory"), "out_of_memory"),
    (BuildError("nvcc failed", "fix the source", "error: expected ';'"), "build_error"),
    (RuntimeError("Error building extension 'relu_ext'"), "build_error"),
    (ToolchainError("nvcc not found", "install CUDA"), "toolchain"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "illegal_memory_access"),
    (RuntimeError("cudaErrorMisalignedAddress: misaligned address"), "cuda_error"),
    (RuntimeError("CUDA error: device-side assert triggered"), "cuda_error"),
    (ValueError("shapes do not match"), "exception"),
])
def test_classify_error(err, kind):
    assert classify_error(err, str(err)) == kind


def test_describe_error_names_the_candidates_line():
    namespace = {}
    code = compile("def forward():\n    x = 1\n    raise ValueError('bad shape')\n", "/tmp/w/candidate.py", "exec")
    exec(code, namespace)  # noqa: S102 - a stand-in for the candidate's module file
    try:
        namespace["forward"]()
    except ValueError as err:
        described = describe_error(err)
    assert described["kind"] == "exception" and described["type"] == "ValueError"
    assert described["candidate_line"] == 3 and "bad shape" in described["traceback"]


def test_error_failure_feedback_by_kind():
    build = error_failure({"kind": "build_error", "type": "BuildError", "message": "nvcc failed",
                           "distilled": "candidate.cu(12): error: identifier \"tile\" is undefined"}, "build")
    assert build == ("build_error", "The build failed:\ncandidate.cu(12): error: identifier \"tile\" is undefined")
    oom = error_failure({"kind": "out_of_memory", "type": "OutOfMemoryError", "message": "Tried to allocate",
                         "candidate_line": 7}, "correctness")
    assert oom[0] == "out_of_memory" and "during correctness at line 7 of the candidate" in oom[1]
    illegal = error_failure({"kind": "illegal_memory_access", "type": "RuntimeError", "message": "illegal"}, "timing")
    assert illegal[0] == "illegal_memory_access" and "predication of residue tiles" in illegal[1]
    assert error_failure({"kind": "exception", "type": "ImportError", "message": "no module x"}, "build")[0] \
        == "import_error"
    runtime = error_failure({"kind": "exception", "type": "ValueError", "message": "bad"}, "anticheat")
    assert runtime == ("runtime_error", "ValueError while running the candidate (anticheat): bad")


def test_died_feedback_and_crash_line():
    assert "within 300 s" in died_feedback("build_timeout", "", "build", 300.0)
    hang = died_feedback("run_timeout", "timing did not finish", "timing", 60.0)
    assert "timing stage did not finish within 60 s" in hang and "never terminates" in hang
    crashed = died_feedback("worker_crashed", "the worker was killed by SIGSEGV during run_trial", "correctness", 60)
    assert "segmentation fault" in crashed
    assert "channel broke" in died_feedback("worker_protocol", "not ours", "correctness", 60)
    log = ('Fatal Python error: Segmentation fault\n  File "/tmp/w/candidate.py", line 41 in forward\n'
           '  File "/x/cutegen/evaluate/runner.py", line 99 in run_trial\n')
    assert crash_line('  File "/tmp/w/candidate.py", line 41, in forward\n') == 41
    assert crash_line(log) == 41
    assert crash_line("no stack here") is None


def test_saved_runs_keys_are_pinned():
    """request_sha256 keys recorded replies, eval_key recorded verdicts, cache_key and build_key builds:
    a saved run, and a build cache made on another machine, are found only while these stay put. A
    change here must be meant (a judgement-relevant EvalConfig field changes eval_key on purpose)."""
    from cutegen.config import EvalConfig
    from cutegen.journal import eval_key
    from cutegen.llm import request_sha256
    from cutegen.records import Message, Request
    from cutegen.runtime.build import build_key, cache_key

    request = Request((Message("system", "You write CuTe kernels."), Message("user", "Task: relu")), 4096,
                      "level1/19", "generate", 0)
    assert request_sha256(request, "anthropic:claude-x") == \
        "04beca23f945c6891860708b4a1e9d7e195a3769687e7506f38e3cfc2fb6d996"
    assert cache_key("__global__ void k(){}", ("-O3", "-std=c++17"), "sm_90a",
                     "Cuda compilation tools, release 13.0, V13.0.88", "hdr") == \
        "d33589970e9df47a15622d8d11989e884e8dd592a1253b4977ea2920e1255f32"
    # The key build_library uses: content only, no include path (the same in every virtual environment).
    assert build_key("__global__ void k(){}", "sm_90a", "Cuda compilation tools, release 13.0, V13.0.88", "hdr") == \
        "6113295b7868617d9f65b4f1589dc42b5ab9a453782a92c537d91fe570f0af24"
    # Since the timing protocol's batches, calibration and guard settings joined the fingerprint.
    assert eval_key("a" * 64, "b" * 64, EvalConfig()) == \
        "954e0dc1f18bd6a2cb5e707efb4b373f4f3b46d5d5e024e1544b49e1c4e6f6e3"
