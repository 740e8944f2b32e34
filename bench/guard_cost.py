"""What the worker's audit hook (src/cutegen/evaluate/guard.py) costs per event, on this machine's CPU.

Every kernel launch of a CuTe candidate is a ctypes foreign call from cutegen.runtime (launch.py), and
every foreign call raises the `ctypes.call_function` audit event: the hook's cost on that path is what
each launch pays. Measured here on a foreign call of the same kind (libc's getpid through ctypes, from
a function in a trusted place, as launch.py is), with and without the hook, each in a fresh process;
also an event the hook ignores (`builtins.id`) and one it judges for trusted code (`sys._getframe`).

    python3 bench/guard_cost.py [--calls N] [--out bench/results/guard-cost-cpu.md]
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

    def foreign(n: int) -> None:
        for _ in range(n):
            getpid()

    def lookup(n: int) -> None:
        for _ in range(n):
            libc["getpid"]  # a symbol looked up again: the ctypes.dlsym event

    def ignored(n: int) -> None:
        for _ in range(n):
            id(n)

    def frames(n: int) -> None:
        for _ in range(n):
            frame()

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    base = _best_ns(empty, calls)
    return {name: _best_ns(loop, calls) - base for name, loop in
            (("ctypes_call_ns", foreign), ("ctypes_dlsym_ns", lookup), ("ignored_event_ns", ignored),
             ("judged_event_ns", frames))}


def child(mode: str, calls: int) -> None:
    """One process's numbers, as JSON on stdout: bare, with a hook that does nothing, or guarded."""
    if mode == "empty":
        sys.addaudithook(lambda event, args: None)
    if mode == "guarded":
        from cutegen.evaluate.guard import install

        scratch = Path(tempfile.mkdtemp(prefix="guard-cost-"))
        install(scratch / "candidate.py", scratch, trusted=[HERE])  # this file stands for cutegen.runtime
    print(json.dumps(_measure(calls)))


def run(mode: str, calls: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--calls", str(calls)],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def report(calls: int) -> str:
    bare, empty, guarded = run("bare", calls), run("empty", calls), run("guarded", calls)
    rows = [f"| {name} | {bare[name]:.0f} | {empty[name] - bare[name]:.0f} | {guarded[name] - bare[name]:.0f} |"
            for name in bare]
    return "\n".join([
        "# The audit hook's cost per event (CPU)",
        "",
        f"`python3 bench/guard_cost.py --calls {calls}` on {platform.processor() or platform.machine()},"
        f" Python {platform.python_version()}; fastest of 7 runs, ns per call, the empty loop's cost taken off.",
        "",
        "| event | without a hook (ns) | added by an empty hook (ns) | added by the guard (ns) |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "ctypes_call_ns: a foreign call from trusted code (each CuTe kernel launch is one; Python 3.11 raises",
        "no audit event for it, so the hook is not called);",
        "ctypes_dlsym_ns: a symbol looked up from trusted code (`ctypes.dlsym`: the hook's one-lookup path for",
        "trusted ctypes use; the timing loop's persisting-L2 reset loads libcudart and two symbols per call);",
        "ignored_event_ns: `id()`, an event the hook returns from at its first lookup;",
        "judged_event_ns: `sys._getframe()` from trusted code (the hook walks to the first trusted frame).",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--child", choices=("bare", "empty", "guarded"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.calls)
        return
    text = report(args.calls)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
