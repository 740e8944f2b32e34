"""Speed of light: the time no implementation can beat, from the task's work and the device's peaks.

bound_ms = max(FLOPs / compute peak, minimum bytes / memory bandwidth). FLOPs come from the trace
(`torch.utils.flop_counter`; ops it does not count, such as softmax or layer_norm, leave the task
bounded by bytes, which is right for them); minimum bytes are inputs and weights read once and
outputs written once. The compute peak follows the precision track: fp32 tensors on the fp32 track
may use CUDA cores or fp32-accurate tensor-core schemes (3xTF32, a third of the TF32 rate), so the
bound takes the faster of the two; the tf32 track uses the TF32 peak; bf16/fp16 tasks use the
half-precision peak in both tracks. Memory bandwidth and the half-precision peak are measured on the
device (a large copy or read, whichever is faster; an 8192^3 bf16 matmul), fp32 and TF32 come from
the datasheet when the device is known, measured otherwise.

Two bounds come out of the same formula. The reference algorithm's work bound (`work_bound_ms`, and
`sol_fraction` in every verdict, report and log line) takes the hardware's peaks (`physical_peaks`:
the larger of the measured and the datasheet rate of each peak), so no honest kernel that does the
reference's work reaches more than 100% of it; a task's stated structure can need less work than its
reference (level1/14's triangular products), which the judge treats as evidence to verify, not as a
verdict. The achievable bound (`sol_bound_ms` at the measured peaks) is what a very good kernel
reaches, not a limit: on an H200, torch.compile's MSELoss and HuberLoss reductions (KernelBench
level1/94, 96) read 7.8% faster than the best of the 1 GiB copy and sum (4184 GB/s), while the
hardware's 4800 GB/s keeps them under the work bound. It may be shown beside the work bound, under
its own name, never as "speed of light".
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from cutegen.evaluate.cache import load_json, save_json, slug
from cutegen.records import Peaks, TaskTrace, from_json, to_json

# Dense peaks by device-name fragment (first match wins): fp32 SIMT, TF32, bf16/fp16 TFLOP/s, GB/s.
DATASHEET: tuple[tuple[str, float, float, float, float], ...] = (
    ("H200", 67.0, 494.7, 989.4, 4800.0),
    ("H100 PCIe", 51.2, 378.0, 756.0, 2000.0),
    ("H100", 67.0, 494.7, 989.4, 3350.0),
    ("A100", 19.5, 156.0, 312.0, 2039.0),
)
COPY_BYTES = 1 << 30
MATMUL_N = 8192


def datasheet_peaks(device_name: str) -> Peaks | None:
    for fragment, fp32, tf32, half, bandwidth in DATASHEET:
        if fragment in device_name:
            return Peaks(device_name, fp32, tf32, half, bandwidth, measured=())
    return None


def physical_peaks(peaks: Peaks) -> Peaks:
    """Each peak as the larger of the measured and the datasheet rate: no honest kernel beats these.
    A device missing from the datasheet keeps its measured peaks (the slack is all the margin then)."""
    sheet = datasheet_peaks(peaks.device_name)
    if sheet is None:
        return peaks
    return replace(peaks, fp32_tflops=max(peaks.fp32_tflops, sheet.fp32_tflops),
                   tf32_tflops=max(peaks.tf32_tflops, sheet.tf32_tflops),
                   half_tflops=max(peaks.half_tflops, sheet.half_tflops),
                   bandwidth_gb_s=max(peaks.bandwidth_gb_s, sheet.bandwidth_gb_s), measured=())


def compute_peak_tflops(peaks: Peaks, track: str, half: bool) -> float:
    """The compute peak a candidate on this track may reach (see the module docstring)."""
    if half:
        return peaks.half_tflops
    if track == "tf32":
        return peaks.tf32_tflops
    return max(peaks.fp32_tflops, peaks.tf32_tflops / 3.0)  # 3xTF32 is fp32-accurate


def sol_bound_ms(trace: TaskTrace, peaks: Peaks, track: str, half: bool) -> float | None:
    """max(FLOPs / peak, min_bytes / bandwidth) in milliseconds; None when the trace failed."""
    if trace.flops is None or trace.min_bytes is None:
        return None
    compute_s = trace.flops / (compute_peak_tflops(peaks, track, half) * 1e12)
    memory_s = trace.min_bytes / (peaks.bandwidth_gb_s * 1e9)
    return max(compute_s, memory_s) * 1e3


def work_bound_ms(trace: TaskTrace, peaks: Peaks, track: str, half: bool) -> float | None:
    """The reference algorithm's work bound: `sol_bound_ms` at the hardware's peaks (`physical_peaks`),
    the bound every fraction the product prints is of. Measured peaks alone would let an honest
    torch.compile reduction read above 100% (the module docstring)."""
    return sol_bound_ms(trace, physical_peaks(peaks), track, half)


# ------------------------------------------------------------------------- measuring (in a worker)


def _time_ms(fn: Any, repeats: int) -> float:
    """Median device time of `fn` between two events, without the timing protocol's device-wide
    synchronize: a peak is a property of the device, measured with as little host time as possible."""
    import torch  # lazy: loading torch takes seconds

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _bandwidth_gb_s() -> tuple[float, float]:
    """(copy, read) bandwidth of a 1 GiB buffer; a copy counts bytes read plus bytes written."""
    import torch  # lazy: loading torch takes seconds

    x = torch.empty(COPY_BYTES // 4, device="cuda", dtype=torch.float32).uniform_()
    y = torch.empty_like(x)
    copy = 2 * COPY_BYTES / (_time_ms(lambda: y.copy_(x), 20) * 1e-3) / 1e9
    read = COPY_BYTES / (_time_ms(lambda: x.sum(), 20) * 1e-3) / 1e9
    return copy, read


def _matmul_tflops(dtype: Any, tf32: bool, n: int) -> float:
    import torch  # lazy: loading torch takes seconds

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        ms = _time_ms(lambda: torch.mm(a, b), 10)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def measure_peaks() -> dict[str, Any]:
    """Measure the current CUDA device: memory bandwidth (copy and read, GB/s) and matmul TFLOP/s
    (bf16 always; TF32 and fp32 too, for devices missing from the datasheet)."""
    import torch  # lazy: loading torch takes seconds

    name = torch.cuda.get_device_name(0)
    copy_gb_s, read_gb_s = _bandwidth_gb_s()
    result = {"device_name": name, "bandwidth_gb_s": max(copy_gb_s, read_gb_s),
              "copy_gb_s": copy_gb_s, "read_gb_s": read_gb_s,
              "half_tflops": _matmul_tflops(torch.bfloat16, False, MATMUL_N)}
    if datasheet_peaks(name) is None:
        result["tf32_tflops"] = _matmul_tflops(torch.float32, True, MATMUL_N)
        result["fp32_tflops"] = _matmul_tflops(torch.float32, False, MATMUL_N // 2)
    torch.cuda.empty_cache()
    return result


def combine_peaks(measured: dict[str, Any]) -> Peaks:
    """Measured bandwidth and half peak; fp32/TF32 from the datasheet when the device is known."""
    name = measured["device_name"]
    sheet = datasheet_peaks(name)
    fields = ["bandwidth_gb_s", "half_tflops"] + (["fp32_tflops", "tf32_tflops"] if sheet is None else [])
    return Peaks(
        device_name=name,
        fp32_tflops=float(measured["fp32_tflops"] if sheet is None else sheet.fp32_tflops),
        tf32_tflops=float(measured["tf32_tflops"] if sheet is None else sheet.tf32_tflops),
        half_tflops=float(measured["half_tflops"]),
        bandwidth_gb_s=float(measured["bandwidth_gb_s"]),
        measured=tuple(fields),
    )


# -------------------------------------------------------------------------------- cache (parent)


def peaks_path(cache_dir: Path, device_name: str, torch_version: str) -> Path:
    return Path(cache_dir) / "peaks" / f"{slug(device_name)}-torch{slug(torch_version)}.json"


def load_peaks(path: Path) -> Peaks | None:
    data = load_json(path)
    try:
        return from_json(Peaks, data) if isinstance(data, dict) else None
    except TypeError:
        return None


def get_peaks(cache_dir: Path, pool: Any, run_timeout_s: float) -> Peaks | None:
    """The pool's device peaks, from the cache or measured once in a fresh worker; None on a CPU."""
    if pool.device != "cuda":
        return None

    def measure() -> dict[str, Any]:
        with pool.worker() as worker:
            worker.settle()
            return worker.call("peaks", timeout_s=run_timeout_s)

    return cached_peaks(cache_dir, pool.info(), measure)


def cached_peaks(cache_dir: Path, info: dict[str, Any], measure: Any) -> Peaks:
    """The device's peaks (`info` names it) from the cache, or `measure()`d (a worker's reply to
    `peaks`) and cached; the datasheet's when the measurement fails, which still bounds a candidate,
    less tightly."""
    path = peaks_path(cache_dir, info["device_name"], info["torch_version"])
    cached = load_peaks(path)
    if cached is not None:
        return cached
    try:
        reply = measure()
    except Exception as err:  # noqa: BLE001 - a worker that died measuring: fall back to the datasheet
        reply = {"ok": False, "error": str(err)}
    if not reply.get("ok"):
        return datasheet_peaks(info["device_name"])
    peaks = combine_peaks(reply["data"])
    save_json(path, to_json(peaks))
    return peaks
