"""The cuda backend (own CUDA kernels, CuTe optional) from the command line, on a CPU: `cutegen eval
--backend cuda` rejects every cheat fixture that applies to cuda by its named check (the static stage,
which needs no GPU), stops an honest plain-CUDA candidate with "needs a GPU" (76) after what this
machine can judge, and refuses settings it cannot honour; the other commands take the backend; and
`cutegen report` over a cute run and a cuda run of one suite shows them side by side per task.

The GPU half (the plain-CUDA candidates judged end to end, the op and kernel audits under cuda) runs
on the GPU machine: tests/test_fixtures_gpu.py (each fixture under each of its backends)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cutegen import bench
from cutegen.cli import main
from cutegen.evaluate.checks_static import STATIC_CHECK_BACKENDS

from helpers import backends, header, needs_nvcc, task_path
from test_report_html import synthetic_run

REPO = Path(__file__).resolve().parents[1]
CHEATS = sorted((REPO / "tests" / "fixtures" / "cheats").glob("[0-9][0-9]_*.py"))
# The fixtures the static stage must reject under cuda: their check is static and applies there.
CUDA_STATIC = [p for p in CHEATS if "cuda" in backends(p) and header(p)["caught-by"] in STATIC_CHECK_BACKENDS]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit of a machine without a GPU")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTEGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUTEGEN_ARCH", raising=False)


def _eval(capsys, candidate: Path, *args: str) -> tuple[int, str]:
    """`cutegen eval` in this process: (exit status, stdout + stderr)."""
    try:
        main(["eval", str(candidate), *args])
        code = 0
    except SystemExit as done:
        code = done.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_eval_under_cuda_rejects_every_applicable_cheat_by_its_named_check(capsys):
    assert len(CUDA_STATIC) >= 20
    for path in CUDA_STATIC:
        code, out = _eval(capsys, path, "--task", str(task_path(path, REPO)), "--backend", "cuda", "--no-timing")
        assert code == 1, (path.name, out)
        assert "backend cuda: REJECTED" in out and header(path)["caught-by"] in out, (path.name, out)


@no_gpu
def test_eval_under_cuda_passes_an_honest_plain_cuda_kernel_to_the_gpu(capsys):
    """The static stage accepts it; without a GPU (and without CUTEGEN_ARCH, so nothing is built) the
    evaluation stops with 76 and says what passed, instead of failing for want of CUDA."""
    honest = REPO / "tests" / "fixtures" / "honest" / "cuda_matmul.py"
    code, out = _eval(capsys, honest, "--task", str(task_path(honest, REPO)), "--backend", "cuda", "--no-timing")
    assert code == 76, out
    assert "needs a GPU" in out and "static checks of backend cuda" in out and "REJECTED" not in out
    code, out = _eval(capsys, honest, "--task", str(task_path(honest, REPO)), "--backend", "cute", "--no-timing")
    assert code == 1 and "check_uses_cute" in out  # the same kernel is no CuTe kernel


@pytest.mark.nvcc
@needs_nvcc
def test_the_honest_plain_cuda_gemm_builds_for_sm90a(tmp_path):
    """Its build comes before everything the GPU judges: the runtime builds plain CUDA as it builds CuTe."""
    import importlib.util

    from cutegen.config import RuntimeConfig
    from cutegen.runtime import find_kernels

    path = REPO / "tests" / "fixtures" / "honest" / "cuda_matmul.py"
    spec = importlib.util.spec_from_file_location("honest_cuda_matmul", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # declaring a CuteKernel compiles nothing
    (kernel,) = find_kernels(module)
    result = kernel.build(RuntimeConfig(cache_dir=tmp_path / "build", arch="sm_90a"))
    assert result.arch == "sm_90a" and result.library_path.is_file()


def test_settings_the_cuda_backend_cannot_honour_are_usage_errors(capsys, tmp_path):
    honest = REPO / "tests" / "fixtures" / "honest" / "cuda_matmul.py"
    task = str(task_path(honest, REPO))
    code, out = _eval(capsys, honest, "--task", task, "--backend", "cuda", "--device", "cpu")
    assert code == 2 and "backend cuda" in out and "Fix:" in out and "Traceback" not in out
    code, out = _eval(capsys, honest, "--task", task, "--backend", "triton")
    assert code == 2 and "cute, cuda, torch" in out
    for command in (["optimize", task, "--model", "replay:x.jsonl"], ["bench", task, "--evaluate", str(tmp_path)]):
        with pytest.raises(SystemExit) as usage:
            main([*command, "--backend", "cuda", "--device", "cpu", "--runs-dir", str(tmp_path / "runs")])
        assert usage.value.code == 2, command
        assert "backend cuda" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


@pytest.mark.parametrize("command", ["eval", "optimize", "bench"])
def test_every_judging_command_offers_the_cuda_backend(command, capsys):
    main([command, "--help"])
    assert "cuda (own CUDA" in " ".join(capsys.readouterr().out.replace("│", " ").split())  # rich wraps in a box


def test_report_shows_a_cute_and_a_cuda_run_side_by_side(tmp_path, capsys):
    """Two recorded runs of one suite (results.json, as `bench` writes them), judged under cute and
    under cuda: the report names each run's backend in its label, the summary and the per-task rows,
    and lines up each task's two results."""
    runs = []
    for backend, scale in (("cute", 1.0), ("cuda", 1.5)):
        run = synthetic_run(f"kb-{backend}", "delayed:2", scale, tmp_path)
        run_dir = tmp_path / f"kb-{backend}"
        run_dir.mkdir()
        bench.write_results(run_dir, list(run.results), kind="agent", model=run.model, agent=run.agent,
                            evaluation={**run.evaluation, "backend": backend, "device": "cuda"}, manifest=run.manifest)
        runs.append(run_dir)
    main(["report", *map(str, runs), "--out", str(tmp_path / "report")])
    assert "report:" in capsys.readouterr().out
    md = (tmp_path / "report" / "bench-report.md").read_text()
    cute, cuda = "kb-cute (eval.backend=cute)", "kb-cuda (eval.backend=cuda)"
    assert f"| task | {cute} | {cuda} |" in md  # the labels name the backend that sets the runs apart
    assert "| level1/19 | correct, 1.4x (1.1x compile) | correct, 2.1x (1.65x compile) |" in md
    assert "| level2/14 | correctness: compare_outputs | correctness: compare_outputs |" in md
    assert f"| level1 | {cute} | cute | 2 |" in md and f"| level1 | {cuda} | cuda | 2 |" in md
    assert f"| level1/19 | {cuda} | cuda | correct |" in md
    html = (tmp_path / "report" / "bench-report.html").read_text()
    assert 'id="side-by-side"' in html and f"{cuda}</th>" in html
    data = json.loads((runs[1] / bench.RESULTS).read_text())
    assert data["evaluation"]["backend"] == "cuda"  # the results name the backend too


def test_one_run_has_no_side_by_side_table(tmp_path):
    from cutegen.report import Series, write_report

    run = synthetic_run("solo", "none", 1.0, tmp_path)
    md, html = write_report([replace(run, evaluation={**run.evaluation, "backend": "cuda"})], tmp_path / "r")
    text = md.read_text()
    assert "side by side" not in text and "| level1/19 | solo | cuda | correct |" in text
    # Runs of one backend side by side (labels that do not name it): the column headings add it.
    assert Series("solo", "#000", run).heading == "solo (cute)"
    assert Series("kb (eval.backend=cute)", "#000", run).heading == "kb (eval.backend=cute)"
