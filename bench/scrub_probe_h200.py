"""What the device does after memory goes back to the driver: after `churn_free_memory` (or an
`empty_cache` of a few sets of inputs), a 1 GiB read is timed every few milliseconds, with the free
memory the driver reports, for a second. Calls the package's functions, no CLI.

    python3 bench/scrub_probe_h200.py --out DIR

Writes DIR/scrub-probe-h200.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

import torch  # noqa: E402

from cutegen.evaluate.checks_dynamic import churn_free_memory  # noqa: E402
from cutegen.manifest import machine_manifest  # noqa: E402


def probe(buffer: torch.Tensor, seconds: float) -> list[tuple[float, float, int]]:
    """(seconds since the start, ms of one read of `buffer`, free bytes) every few milliseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    samples = []
    while time.perf_counter() - began < seconds:
        start.record()
        buffer.max()
        end.record()
        end.synchronize()
        samples.append((round(time.perf_counter() - began, 4), round(start.elapsed_time(end), 4),
                        torch.cuda.mem_get_info()[0]))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    buffer = torch.ones(1 << 28, dtype=torch.float32, device=device)  # 1 GiB
    runs = {"idle": probe(buffer, 0.3)}
    churn_free_memory(device)
    runs["after churn_free_memory"] = probe(buffer, 1.0)
    sets = [torch.ones(1 << 31, dtype=torch.float32, device=device) for _ in range(2)]  # 2 x 8 GiB
    torch.cuda.synchronize()
    del sets
    torch.cuda.empty_cache()
    runs["after empty_cache of 16 GiB"] = probe(buffer, 0.5)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = machine_manifest()
    (args.out / "scrub-probe-h200.json").write_text(json.dumps({"samples": runs, "manifest": manifest}, indent=1))
    lines = ["# A 1 GiB read after memory went back to the driver", "",
             "| after | reads | first ms | median ms, first 0.1 s | median ms, last 0.1 s | seconds until within 3% of idle | free GiB first, last |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    idle = sorted(ms for _, ms, _ in runs["idle"])[len(runs["idle"]) // 2]
    for name, samples in runs.items():
        total = samples[-1][0]
        head = sorted(ms for t, ms, _ in samples if t < 0.1)
        tail = sorted(ms for t, ms, _ in samples if t > total - 0.1)
        late = [t for t, ms, _ in samples if ms > 1.03 * idle]
        lines.append(f"| {name} | {len(samples)} | {samples[0][1]:.4g} | {head[len(head) // 2]:.4g} | "
                     f"{tail[len(tail) // 2]:.4g} | {max(late) if late else 0:.3g} | "
                     f"{samples[0][2] / 2**30:.1f}, {samples[-1][2] / 2**30:.1f} |")
    lines += ["", "```json", json.dumps(manifest, indent=1), "```", ""]
    (args.out / "scrub-probe-h200.md").write_text("\n".join(lines))
    print("\n".join(lines[:len(runs) + 4]))
    for name, samples in runs.items():  # the series, thinned
        print(name, " ".join(f"{t:.3f}:{ms:.3f}:{free / 2**30:.1f}" for t, ms, free in samples[::max(1, len(samples) // 40)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
