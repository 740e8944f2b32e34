"""The HTML report in a real browser: headless Chromium opens the page and reports what a person's
browser would show (console errors, uncaught exceptions, failed loads) and how big each plot is drawn.

The browser is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages
separated by NUL bytes on file descriptors 3 and 4), so no driver package is needed. The tests skip
when no Chromium is installed; CI installs Debian's `chromium` (.ci/run).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cutegen.bench import summarize
from cutegen.records import BenchRun, BenchTaskResult, TrajectoryPoint
from cutegen.report import write_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class Browser:
    """One headless Chromium page driven over the DevTools pipe."""

    def __init__(self, binary: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="cutegen-chromium-")
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        # The protocol reads commands from fd 3 and writes replies to fd 4. The pipe ends are first
        # moved above 10 (close-on-exec), so that placing one on 3 cannot clobber the other.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child, from_child)]
        for fd in (to_child, from_child):
            os.close(fd)

        def place_fds() -> None:  # in the child, before exec: dup2'd descriptors survive the exec
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", "--window-size=1300,1000", "about:blank"],
            preexec_fn=place_fds, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        for fd in high:
            os.close(fd)
        self._buffer, self._next_id, self.events, self.session = b"", 0, [], None

    def command(self, method: str, params: dict | None = None, timeout_s: float = 30.0) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        reply = self.wait(lambda m: m.get("id") == self._next_id, timeout_s)
        assert "error" not in reply, reply
        return reply["result"]

    def wait(self, predicate, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if predicate(message):
                    return message
            ready, _, _ = select.select([self._read], [], [], 0.2)
            if ready:
                chunk = os.read(self._read, 1 << 16)
                assert chunk, "Chromium closed the DevTools pipe"
                self._buffer += chunk
        raise TimeoutError("no reply from Chromium")

    def open(self, path: Path) -> None:
        target = self.command("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.command(f"{domain}.enable")
        self.command("Page.navigate", {"url": path.resolve().as_uri()})
        self.wait(lambda m: m.get("method") == "Page.loadEventFired", 60.0)

    def evaluate(self, expression: str):
        result = self.command("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen so far."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif event["method"] == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return found

    def close(self) -> None:
        try:
            self.command("Browser.close", timeout_s=10.0)
            self.process.wait(timeout=15)
        except Exception:  # noqa: BLE001 - a browser that will not close is killed
            self.process.kill()
            self.process.wait()
        os.close(self._write)
        os.close(self._read)
        shutil.rmtree(self.profile, ignore_errors=True)


def render_in_chromium(html: Path) -> dict:
    """Open `html` and return what a person would see: problems and every plot's drawn size."""
    binary = find_browser()
    if binary is None:
        pytest.skip("no Chromium installed (CI installs Debian's chromium)")
    browser = Browser(binary)
    try:
        browser.open(html)
        time.sleep(0.3)  # late console messages
        plots = browser.evaluate("""Array.from(document.querySelectorAll('svg.plot')).map(s => {
            const r = s.getBoundingClientRect();
            return {label: s.getAttribute('aria-label'), width: r.width, height: r.height,
                    marks: s.querySelectorAll('path, use, rect, polyline').length};
        })""")
        external = browser.evaluate("""Array.from(document.querySelectorAll('[src], link[href], script'))
            .map(e => e.getAttribute('src') || e.getAttribute('href') || 'inline script')""")
        text = browser.evaluate("document.body.innerText")
        return {"problems": browser.problems(), "plots": plots, "external": external, "text": text}
    finally:
        browser.close()


# ------------------------------------------------------------------------------ synthetic runs


def _point(index, stage, speedup, best, profile=False):
    return TrajectoryPoint(index=index, stage=stage, round=max(0, index - 1), passed=speedup is not None,
                           speedup_vs_eager=speedup, best_speedup_vs_eager=best, profile_shown=profile,
                           improved=speedup is not None and speedup == best, outcome="passed" if speedup else "failed")


def _result(task_id, level, speedup, compile_speedup, sol, cost, trajectory, excluded=()):
    return BenchTaskResult(
        task_id=task_id, name=task_id.replace("/", "_"), level=level, problem_id=int(task_id.split("/")[1]),
        sample_id=None, compiled=True, correctness=speedup is not None, runtime=None, ref_runtime=None,
        status="done", stage_reached="passed" if speedup else "correctness", failure=None if speedup else "compare_outputs",
        median_ms=0.5 if speedup else None, eager_median_ms=0.7, compile_median_ms=0.6, speedup_vs_eager=speedup,
        speedup_vs_compile=compile_speedup, sol_fraction=sol, needs_review=False, degenerate=(), excluded=excluded,
        candidate_sha256=None, candidate_path=None, stop_reason="done", steps=len(trajectory), rounds=2, llm_calls=4,
        input_tokens=4000, output_tokens=2000, cost_usd=cost, gpu_s=12.0, trajectory=tuple(trajectory))


def synthetic_run(run_id: str, profiling: str, scale: float, path: Path) -> BenchRun:
    results = [
        _result("level1/19", 1, 1.4 * scale, 1.1 * scale, 0.62, 0.031,
                [_point(0, "generate", None, None), _point(1, "repair_build", 0.9, 0.9), _point(2, "optimize", 1.4 * scale, 1.4 * scale),
                 _point(3, "optimize", 1.2, 1.4 * scale, profile=True)]),
        _result("level1/23", 1, 3.0, 2.5, 0.91, 0.052, [_point(0, "generate", 3.0, 3.0)], excluded=("degenerate",)),
        _result("level2/14", 2, None, None, None, 0.2,
                [_point(0, "generate", None, None), _point(1, "repair_correctness", None, None)]),
        _result("level2/40", 2, 0.8 * scale, 0.5, 0.33, 0.11,
                [_point(0, "generate", 0.8 * scale, 0.8 * scale), _point(1, "optimize", None, 0.8 * scale, profile=True)]),
    ]
    return BenchRun(run_id=run_id, kind="agent", path=path, model="anthropic:claude-sonnet-4-5", recorded=False,
                    suite="kernelbench", suite_commit="423217d9fda91e0c2d67e4a43bf62f96f6d104f1", tasks_sha256="ab" * 32,
                    agent={"rounds": 3, "repairs": 2, "profiling": profiling}, evaluation={"track": "fp32", "backend": "cute"},
                    tolerance={"track": "fp32", "atol": 1e-4, "rtol": 1e-4, "half_atol": 2e-2, "half_rtol": 2e-2},
                    manifest={"gpu_name": "NVIDIA H200", "torch_version": "2.11.0", "cutlass_version": "4.2.0.0"},
                    results=tuple(results), summary=tuple(summarize(results)))


def test_side_by_side_report_renders_every_plot_without_errors(tmp_path):
    runs = [synthetic_run("none", "none", 1.0, tmp_path), synthetic_run("delayed", "delayed:2", 1.5, tmp_path),
            replace(synthetic_run("immediate", "immediate", 1.2, tmp_path), recorded=True)]
    md, html = write_report(runs, tmp_path / "report")
    page = render_in_chromium(html)
    assert page["problems"] == []
    assert page["external"] == []  # self-contained: nothing loaded from anywhere
    labels = [p["label"] for p in page["plots"]]
    # 4 summary plots (speedups, fast_p, cost, work bound) + one trajectory per task
    assert labels[:4] == ["Speedup per task", "fast_p curve", "Cost per task", "Work bound"]
    assert sorted(labels[4:]) == sorted(f"Trajectory of {t}" for t in ("level1/19", "level1/23", "level2/14", "level2/40"))
    for plot in page["plots"]:
        assert plot["width"] > 200 and plot["height"] > 100 and plot["marks"] > 10, plot
    # the ablation labels name the setting that differs; the summary has per-level and clean rows
    assert "none (profiling=none)" in page["text"] and "delayed (profiling=delayed:2)" in page["text"]
    for group in ("level1", "level2", "clean", "clean level1"):
        assert group in page["text"]
    assert "Replayed replies" in page["text"]
    text = md.read_text()
    assert "](plots/fast_p.svg)" in text and (tmp_path / "report" / "plots" / "fast_p.svg").is_file()
    assert "| clean | none (profiling=none) | cute | 3 |" in text  # level1/23 is excluded from the clean subset


def test_the_browser_check_sees_errors_and_missing_plots(tmp_path):
    # The check above can fail: a page with a console error, an uncaught exception, a missing file
    # and no plot is reported as such.
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><img src="missing.png"><script>console.error("boom");'
                    ' undefinedFunction();</script></body></html>')
    seen = render_in_chromium(page)
    kinds = sorted(problem.split(":")[0] for problem in seen["problems"])
    assert kinds == ["console.error", "exception", "log"], seen["problems"]
    assert seen["plots"] == [] and seen["external"] == ["missing.png", "inline script"]
