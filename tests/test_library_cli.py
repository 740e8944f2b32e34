"""The kernel library as a user meets it, on CPU with the torch backend and recorded replies: a bench run
fills it, the next run's first prompt carries the verified kernel of the first run's task, --no-library
leaves no trace, `cutegen eval` adds what it accepts, and `cutegen library` lists, shows, searches,
exports, imports and prunes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
REPLAY = REPO / "tests" / "fixtures" / "bench_replay_torch.jsonl"
HONEST = REPO / "tests" / "fixtures" / "honest"
FAST = ["--backend", "torch", "--device", "cpu", "--correctness-trials", "1", "--timing-trials", "5",
        "--no-compile-baseline"]
AGENT = ["--model", f"replay:{REPLAY}", "--rounds", "1", "--repairs", "1", "--generations", "1", "--profiling", "none",
         "--runs-dir", "runs", "--no-report", *FAST]
SECTION = "## Verified kernels of similar tasks, from the kernel library"


def cutegen(args: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTEGEN_", "ANTHROPIC_", "OPENAI_", "XDG_"))}
    env.update(CUTEGEN_CACHE=str(cwd / "cache"), PYTHONUNBUFFERED="1", COLUMNS="250")
    done = subprocess.run([sys.executable, "-m", "cutegen", *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return done.returncode, done.stdout


def first_prompt(run: Path, task: str) -> str:
    for line in (run / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "step" and record["task_id"] == task and record["index"] == 0:
            return json.loads((run / record["prompt_path"]).read_text())[1]["content"]
    raise AssertionError(f"no first step of {task} in {run}")


def journal_kinds(run: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in (run / "journal.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Three runs in one cache folder, in order: swish_scale with --no-library, swish_scale, layer_norm."""
    work = tmp_path_factory.mktemp("library")
    for run_id, task, extra in (("off", "swish_scale", ["--no-library"]), ("a", "swish_scale", []),
                                ("b", "layer_norm", [])):
        code, out = cutegen(["bench", str(TASKS), "--select", task, *AGENT, "--run-id", run_id, *extra], work)
        assert code == 0, out
        if run_id == "off":  # checked before the next run makes the default library
            assert not (work / "cache" / "library.sqlite").exists()
    return work


def library_json(work: Path, *args: str) -> object:
    code, out = cutegen(["library", *args, "--json"], work)
    assert code == 0, out
    return json.loads(out)


def test_no_library_reads_and_writes_none(work):
    run = work / "runs" / "off"
    assert SECTION not in first_prompt(run, "swish_scale")
    assert "library_examples" not in journal_kinds(run)
    assert json.loads((run / "journal.jsonl").read_text().splitlines()[0])["agent"]["library"] is False


def test_a_bench_run_adds_every_accepted_kernel_with_its_measurements(work):
    entries = library_json(work, "list")
    steps = [json.loads(line) for line in (work / "runs" / "a" / "journal.jsonl").read_text().splitlines()]
    passed = [s for s in steps if s["kind"] == "step" and s["verdict"] and s["verdict"]["passed"]]
    mine = [e for e in entries if e["provenance"]["run_id"] == "a"]
    assert len(passed) == 2 and len(mine) == 2  # the generation and the optimization
    for step, entry in zip(passed, mine):
        verdict = step["verdict"]
        assert entry["content_sha256"] == step["candidate_sha256"] and entry["task_id"] == "swish_scale"
        assert entry["measured"]["median_ms"] == verdict["timing"]["median_ms"]
        assert entry["measured"]["speedup_vs_eager"] == verdict["speedup_vs_eager"]
        assert (entry["backend"], entry["track"], entry["arch"]) == ("torch", "fp32", "cpu")
        assert entry["provenance"]["model"] == "replay:replay.jsonl" and entry["provenance"]["origin"] == "agent"
        assert entry["signature"]["op_class"] == "elementwise" and entry["signature"]["input_shapes"] == [[256, 4096]]


def test_the_next_tasks_first_prompt_carries_the_verified_kernel_and_its_speed(work):
    fastest = max((e for e in library_json(work, "list") if e["task_id"] == "swish_scale"),
                  key=lambda e: e["measured"]["speedup_vs_eager"])
    shown = library_json(work, "show", str(fastest["entry_id"]))
    prompt = first_prompt(work / "runs" / "b", "layer_norm")
    assert SECTION in prompt
    example = prompt[prompt.index(SECTION):]
    assert "task `swish_scale` (elementwise; aten ops sigmoid, mul)" in example
    assert shown["source"].strip() in example
    assert f"{fastest['measured']['speedup_vs_eager']:.3g}x eager PyTorch; measured on cpu, fp32 track" in example
    records = [json.loads(line) for line in (work / "runs" / "b" / "journal.jsonl").read_text().splitlines()]
    (chosen,) = [r for r in records if r["kind"] == "library_examples"]
    assert [e["entry_id"] for e in chosen["examples"]] == [fastest["entry_id"]]  # one per task: its fastest


def test_search_show_export_import_and_prune(work, tmp_path):
    found = library_json(work, "search", str(TASKS / "layer_norm.py"), "--backend", "torch")
    assert [e["task_id"] for e in found][:1] == ["swish_scale"] and found[0]["distance"]["other_class"] == 1
    assert [e["task_id"] for e in library_json(work, "search", "--class", "norm")] == ["layer_norm"]
    code, out = cutegen(["library", "list"], work)
    assert code == 0 and "swish_scale" in out and "replay:replay.jsonl" in out
    first = library_json(work, "list")[0]["entry_id"]
    code, out = cutegen(["library", "export", str(first), "--out", str(tmp_path / "k.py")], work)
    assert code == 0 and "ModelNew" in (tmp_path / "k.py").read_text()
    (imported,) = library_json(work, "import", "runs/a", "runs/off")[:1]
    assert imported["accepted"] == 2 and imported["added"] == 0  # the live run had added them
    off = library_json(work, "import", "runs/off")[0]
    assert off["accepted"] == 2 and off["added"] == 0  # the same kernels on the same task and machine
    before = len(library_json(work, "list"))
    pruned = library_json(work, "prune", "--keep", "1", "--dry-run")
    assert pruned["dry_run"] and len(pruned["removed"]) == before - 2  # one per task stays (two tasks)
    assert len(library_json(work, "list")) == before


def test_eval_adds_an_accepted_kernel_unless_told_not_to(work, tmp_path):
    candidate = tmp_path / "swish.py"
    candidate.write_text((HONEST / "swish_scale.py").read_text())
    args = ["eval", str(candidate), "--task", str(TASKS / "swish_scale.py"), "--backend", "torch", "--device", "cpu",
            "--timing-trials", "5", "--no-compile-baseline"]
    before = library_json(work, "list")
    code, out = cutegen([*args, "--no-library"], work)
    assert code == 0 and "kernel library" not in out and library_json(work, "list") == before
    code, out = cutegen(args, work)
    assert code == 0 and "added as entry" in out
    (new,) = [e for e in library_json(work, "list") if e not in before]
    assert new["provenance"]["origin"] == "eval" and new["provenance"]["model"] is None
    code, out = cutegen([*args, "--library", str(tmp_path / "x.sqlite"), "--no-library"], work)
    assert code == 2 and "--no-library" in out


def test_an_unusable_library_is_named_with_its_fix_before_any_work(work, tmp_path):
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"\x00not sqlite\x00" * 500)
    code, out = cutegen(["bench", str(TASKS), "--select", "swish_scale", *AGENT, "--run-id", "never",
                         "--library", str(broken)], work)
    assert code == 2 and str(broken) in " ".join(out.split()) and ".broken" in out
    assert not (work / "runs" / "never").exists()
    code, out = cutegen(["library", "list", "--library", str(broken)], work)
    assert code == 2 and "cannot be read as an SQLite database" in " ".join(out.split())
