"""What the worker's audit hook (src/cutegen/evaluate/guard.py) costs per event, on this machine's CPU.

Each CuTe kernel launch is a ctypes foreign call from cutegen.runtime: timed here on the same kind of call
(libc's getpid from a trusted file), bare, under an empty hook and under the guard, each in a fresh process;
also an event the hook ignores (`id`) and one it judges (`sys._getframe`). --cuda adds the honest CuTe
twin's forward (one launch through cutegen.runtime; needs nvcc and a GPU).

    python3 bench/guard_cost.py [--calls N] [--cuda] [--out bench/results/guard-cost-cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _best_ns(loop, calls: int, repeats: int = 7) -> float:
    """The fastest of `repeats` runs of `loop(calls)`, in ns per call."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter_ns()
        loop(calls)
        best = min(best, (time.perf_counter_ns() - began) / calls)
    return best


def _measure(calls: int) -> dict[str, float]:
    import ctypes

    libc = ctypes.CDLL(None)
    getpid = libc.getpid
    getpid.restype = ctypes.c_int
    frame = sys._getframe

    def loop(call):  # one Python call per iteration in every loop, the empty one included, taken off below
        def run(n: int) -> None:
            for _ in range(n):
                call()
        return run

    base = _best_ns(loop(lambda: None), calls)
    return {name: _best_ns(loop(call), calls) - base for name, call in
            (("ctypes_call_ns", getpid), ("ctypes_dlsym_ns", lambda: libc["getpid"]),  # lookup: ctypes.dlsym
             ("ignored_event_ns", lambda: id(libc)), ("judged_event_ns", frame))}


def _measure_launch(calls: int) -> dict[str, float]:
    """ns per forward of the honest CuTe twin (one launch each), the device synchronised at the end of each
    run; and the audit events one forward raises."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("cute_twin", REPO / "tests/fixtures/honest/cute_swish_scale.py")
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)  # type: ignore[union-attr]
    model, x = twin.ModelNew(2.0), torch.randn(1 << 12, device="cuda")
    model(x)  # builds (or finds) the kernel
    events: list[str] = []
    counting = False
    sys.addaudithook(lambda event, args: events.append(event) if counting else None)
    counting = True
    model(x)
    counting = False
    per_forward = float(len(events))

    def launches(n: int) -> None:
        for _ in range(n):
            model(x)
        torch.cuda.synchronize()

    return {"cute_forward_ns": _best_ns(launches, calls), "cute_forward_events": per_forward}


def child(mode: str, calls: int, cuda: bool) -> None:
    """One process's numbers, as JSON on stdout: bare, with a hook that does nothing, or guarded."""
    if mode == "empty":
        sys.addaudithook(lambda event, args: None)
    if mode == "guarded":
        from cutegen.evaluate.guard import install

        scratch = Path(tempfile.mkdtemp(prefix="guard-cost-"))
        install(scratch / "candidate.py", scratch, trusted=[HERE])  # this file stands for cutegen.runtime
    found = _measure(calls)
    if cuda:
        found.update(_measure_launch(max(1000, calls // 20)))
    print(json.dumps(found))


def run(mode: str, calls: int, cuda: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--calls", str(calls),
                           *(["--cuda"] if cuda else [])],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def report(calls: int, cuda: bool) -> str:
    bare, empty, guarded = (run(mode, calls, cuda) for mode in ("bare", "empty", "guarded"))
    rows = [f"| {name} | {bare[name]:.0f} | {empty[name] - bare[name]:.0f} | {guarded[name] - bare[name]:.0f} |"
            for name in bare]
    return "\n".join([
        "# The audit hook's cost per event (CPU)",
        "",
        f"`python3 bench/guard_cost.py --calls {calls}{' --cuda' if cuda else ''}`"
        f" on {platform.processor() or platform.machine()},"
        f" Python {platform.python_version()}; fastest of 7 runs, ns per call, the empty loop's cost taken off.",
        "",
        "| event | without a hook (ns) | added by an empty hook (ns) | added by the guard (ns) |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "ctypes_call_ns: a foreign call from trusted code (each CuTe launch is one; Python 3.11 raises no audit event for it);",
        "ctypes_dlsym_ns: a symbol looked up from trusted code through `CDLL.__getitem__` (the hook walks past ctypes's",
        "frames to the trusted caller; the timing loop looks its symbols up once); ignored_event_ns: `id()`, an event",
        "the hook returns from at once; judged_event_ns: `sys._getframe()` from trusted code; cute_forward_ns /",
        "cute_forward_events (--cuda): a forward of the honest CuTe twin (one launch) and the audit events it raises.",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--child", choices=("bare", "empty", "guarded"))
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.calls, args.cuda)
        return
    text = report(args.calls, args.cuda)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
