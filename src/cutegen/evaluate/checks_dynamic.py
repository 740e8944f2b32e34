"""Dynamic anti-cheat checks: run inside the worker, on the real tensors, around the candidate's calls.

Each function's docstring names the exploit it defeats; tests/fixtures/cheats/ holds a candidate that
must trip it. Everything here works on CPU tensors too, except the kernel audit and the memory churn,
which need CUDA and say so (they return an empty result / do nothing on CPU rather than fail).

These checks back up the static ones (checks_static), which cannot see through operators on tensors,
computed names or objects they cannot type. Together they make a robust harness against buggy and
reward-hacking candidates; they are not a security sandbox against a determined attacker who runs
arbitrary code in the worker.
"""

from __future__ import annotations

import inspect
import re
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from cutegen.config import BACKENDS, OWN_KERNEL_BACKENDS
from cutegen.errors import ConfigError
from cutegen.evaluate import compare
from cutegen.evaluate.compare import CHUNK_ELEMENTS, CUDA_CHUNK_ELEMENTS, flatten_outputs
from cutegen.evaluate.timing import give_back_cached

# ----------------------------------------------------------------------------------- op audit

# aten ops a forward that must compute in its own kernels (backends cute, cuda) may run: allocation (and
# zero/constant fills), and the copy that `.contiguous()` makes. View ops are recognised from their
# schema (OpOverload.is_view) as well.
ALLOWED_ATEN_OPS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
        "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
        "zero_", "fill_", "clone", "lift_fresh", "detach", "alias", "view", "_unsafe_view",
        "_reshape_alias", "reshape", "as_strided", "t", "transpose", "permute", "expand", "squeeze",
        "unsqueeze", "slice", "select", "narrow", "split", "split_with_sizes", "unbind", "chunk",
        "unflatten", "flatten", "movedim", "view_as_real", "view_as_complex", "unfold",
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous",
    }
)


class OpAudit(TorchDispatchMode):
    """Records every aten op that runs inside the `with` block, in order (`.ops`, e.g. "aten.mm.default").

    Defeats torch compute the static check cannot see: operators on tensors (`x * y`), the operator
    module, getattr with computed names, compute reached through objects. Ops run below autograd, so
    composite functions appear as what they decompose to (`torch.matmul` -> "aten.mm.default").

    Not seen: code that pops the dispatch mode (the static check flags the switches that do it, and
    the kernel audit sees the kernels anyway), and work inside C++ that never enters the dispatcher.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _op_parts(op: str) -> tuple[str, str, str]:
    """"aten.mm.default" -> ("aten", "mm", "default"); "aten::mm" style is accepted too."""
    parts = op.replace("::", ".").split(".")
    namespace, name = parts[0], parts[1] if len(parts) > 1 else ""
    return namespace, name, parts[2] if len(parts) > 2 else "default"


def _is_view_op(namespace: str, name: str, overload: str) -> bool:
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        return bool(getattr(packet, overload).is_view)
    except (AttributeError, RuntimeError):
        return False


def disallowed_ops(ops: Sequence[str], backend: str) -> list[str]:
    """The ops (distinct, first-seen order) that a forward of `backend` may not run.

    "cute" and "cuda" (own kernels required): everything except allocation, fills, `.contiguous()`
    copies and views; ops of other namespaces too (a candidate's own kernels run through the project
    runtime or a load_inline module, not the dispatcher). "torch": nothing is flagged.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"Unknown candidate backend {backend!r}.", f"Use one of {', '.join(BACKENDS)}.")
    if backend not in OWN_KERNEL_BACKENDS:
        return []
    flagged: list[str] = []
    for op in ops:
        namespace, name, overload = _op_parts(op)
        allowed = namespace in ("aten", "prims") and (
            name in ALLOWED_ATEN_OPS or _is_view_op(namespace, name, overload)
        )
        if not allowed and op not in flagged:
            flagged.append(op)
    return flagged


# -------------------------------------------------------------------------------- kernel audit

# Substrings (lower case) of kernel names that come from PyTorch, cuBLAS/cuBLASLt, cuDNN, cuFFT,
# or torch.compile's Triton kernels, not from the candidate's own library. They are looked for in the
# unqualified identifiers of a name only (see `_leading_identifiers`): a CuTe kernel's template
# arguments name library types such as `cute::SM90_TMA_LOAD` or `cutlass::bfloat16_t`, which must not
# make the candidate's own kernel look like a vendor one.
LIBRARY_KERNEL_MARKERS = (
    "cublas", "cudnn", "cufft", "cusparse", "curand", "nvjet",
    "xmma", "cutlass_80_", "cutlass_75_", "cutlass_90_", "cutlass3x_", "cutlass_tensorop",
    "cutlass_simt", "ampere_", "volta_", "turing_", "sm80_", "sm86_", "sm89_", "sm90_", "sm100_",
    "gemv2", "gemvx", "gemmk1", "gemmsn", "splitkreduce", "implicit_convolve", "winograd",
    "fft2d", "fft1d", "regular_fft", "vector_fft", "nchwtonhwc", "nhwctonchw", "triton_",
    "dot_kernel", "reduce_1block", "scal_kernel", "axpy_kernel",
)
# PyTorch's own kernels, recognised by the namespace their name starts with (at any nesting level of
# the name, but never as the inner part of a qualified name).
LIBRARY_NAMESPACES = re.compile(r"(?<![\w:])(?:at::native|at::cuda|c10)::")
# Memory traffic that allocation and layout prep may cause: copies, fills, memsets.
PREP_KERNEL_MARKERS = ("memcpy", "memset", "fillfunctor", "fill_kernel", "direct_copy_kernel")
_IDENTIFIER = re.compile(r"(?<![\w:])[a-z_]\w*")


def _leading_identifiers(lowered: str) -> list[str]:
    """The identifiers of a demangled name that are not the inner part of a qualified name:
    "void ns::k<cute::sm90_tma_load, cutlass_80_x>" -> ["void", "ns", "cute", "cutlass_80_x"]."""
    return _IDENTIFIER.findall(lowered)


def classify_kernel(name: str) -> str:
    """"prep" (copies/fills), "library" (PyTorch/vendor libraries) or "own" (the candidate's)."""
    lowered = name.lower()
    if any(marker in lowered for marker in PREP_KERNEL_MARKERS):
        return "prep"
    if LIBRARY_NAMESPACES.search(lowered):
        return "library"
    if any(marker in token for token in _leading_identifiers(lowered) for marker in LIBRARY_KERNEL_MARKERS):
        return "library"
    return "own"


# The kernel audit's canary, bound when the worker imports this module, before the candidate's import:
# a candidate that replaces `torch.zeros` or `torch.Tensor.add_` later does not reach these (the C type's
# methods cannot be replaced at all).
_CANARY_ZEROS = torch.zeros
_CANARY_ADD = torch._C.TensorBase.add_


def audit_kernels(fn: Callable[..., Any], inputs: Sequence[Any]) -> dict[str, Any]:
    """Run `fn(*inputs)` under the profiler (once, or twice: below) and sort the CUDA kernels it launched.

    Defeats doing the work in cuBLAS/cuDNN/aten kernels while hiding from the op audit (a dispatch
    mode switched off, a C++ extension calling cuBLAS), and "own" kernels that never run. Returns
    {"kernels": [...], "own_kernels": [...], "library_kernels": [...], "prep_kernels": [...],
    "skipped": None or why, "blind": bool}; names are distinct, in launch order. The caller requires
    own_kernels to be non-empty and library_kernels empty where own kernels are required (backends
    cute, cuda). Without CUDA nothing can be seen: the lists are empty and "skipped" says so (a
    candidate judged on CUDA is then judged on those empty lists).

    A profile with no device event at all may be the profiler's failure, not the candidate's: CUPTI
    can fail to start (CUPTI_ERROR_NOT_INITIALIZED, seen once in 39 evaluations on the H200, an honest
    candidate then rejected). A canary (one kernel of this function's own, profiled alone) then tells
    the two apart: seen, the forward is profiled once more and that profile counts; not seen although
    it ran (its result is 1), "blind" is set, which the parent reports as not a verdict on the
    candidate. A canary that did not run (a candidate in the way) leaves the empty profile to be
    judged. Either way a candidate that breaks the profiler is not accepted.
    """
    result: dict[str, Any] = {"kernels": [], "own_kernels": [], "library_kernels": [],
                              "prep_kernels": [], "skipped": None, "blind": False}
    if not torch.cuda.is_available():
        result["skipped"] = "no CUDA device: the kernel audit needs one"
        return result
    names = _profiled_kernel_names(fn, inputs)
    if not names:
        canary = _CANARY_ZEROS(1, device="cuda")
        seen = _profiled_kernel_names(lambda t: _CANARY_ADD(t, 1), [canary])
        if not seen and float(canary.item()) == 1.0:
            result["skipped"] = ("the profiler recorded no device activity, not even a kernel of the judge's own"
                                 " (CUPTI did not start)")
            result["blind"] = True
            return result
        if seen:
            names = _profiled_kernel_names(fn, inputs)
    for name in names:
        if name not in result["kernels"]:
            result["kernels"].append(name)
            result[f"{classify_kernel(name)}_kernels"].append(name)
    return result


def _profiled_kernel_names(fn: Callable[..., Any], inputs: Sequence[Any]) -> list[str]:
    """The device-side events of `fn(*inputs)`, run once under the profiler (_cuda_kernel_names)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    return _cuda_kernel_names(prof)


def _cuda_kernel_names(prof: Any) -> list[str]:
    """Names of the device-side events (kernels, memcpy, memset) of a finished profile, in order."""
    cuda = torch.autograd.DeviceType.CUDA
    events = [e for e in prof.events() if getattr(e, "device_type", None) == cuda]
    events.sort(key=lambda e: e.time_range.start)
    return [e.name for e in events]


# ---------------------------------------------------------------------------------- global state


def _flag_readers() -> dict[str, Callable[[], Any]]:
    """The torch settings that change numerics or speed of what the baseline and the candidate run."""
    backends = torch.backends
    return {
        "torch.backends.cuda.matmul.allow_tf32": lambda: backends.cuda.matmul.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            lambda: backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            lambda: backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.fp32_precision": lambda: backends.cuda.matmul.fp32_precision,
        "torch.backends.cudnn.allow_tf32": lambda: backends.cudnn.allow_tf32,
        "torch.backends.cudnn.conv.fp32_precision": lambda: backends.cudnn.conv.fp32_precision,
        "torch.backends.cudnn.rnn.fp32_precision": lambda: backends.cudnn.rnn.fp32_precision,
        "torch.backends.fp32_precision": lambda: backends.fp32_precision,
        "torch.backends.cudnn.enabled": lambda: backends.cudnn.enabled,
        "torch.backends.cudnn.benchmark": lambda: backends.cudnn.benchmark,
        "torch.backends.cudnn.deterministic": lambda: backends.cudnn.deterministic,
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
        "torch.get_default_dtype()": torch.get_default_dtype,
        "torch.is_grad_enabled()": torch.is_grad_enabled,
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled,
        "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled,
    }


def _watched_objects() -> dict[str, Any]:
    """Functions and classes a candidate could replace to fake a comparison or a timing."""
    import torch.nn.functional as F  # lazy: loading torch takes seconds

    objects: dict[str, Any] = {}
    for name in ("matmul", "mm", "bmm", "addmm", "allclose", "isclose", "equal", "isnan",
                 "isfinite", "isinf", "abs", "max", "min", "sum", "mean", "where", "empty",
                 "empty_like", "zeros", "randn", "rand", "randint", "manual_seed", "as_tensor"):
        objects[f"torch.{name}"] = getattr(torch, name, None)
    for name in ("__eq__", "__ne__", "__sub__", "__lt__", "__le__", "__gt__", "__ge__", "abs", "max",
                 "min", "sum", "item", "tolist", "clone", "copy_", "to", "cpu", "float", "double",
                 "__torch_function__", "__repr__", "__bool__"):
        objects[f"torch.Tensor.{name}"] = getattr(torch.Tensor, name, None)
    for name in dir(F):
        if not name.startswith("_") and callable(getattr(F, name)):
            objects[f"torch.nn.functional.{name}"] = getattr(F, name)
    objects["torch.testing.assert_close"] = torch.testing.assert_close
    objects["torch.nn.Module.__call__"] = torch.nn.Module.__call__
    objects["torch.nn.Module._call_impl"] = getattr(torch.nn.Module, "_call_impl", None)
    for name in ("synchronize", "current_stream", "Event", "Stream", "empty_cache", "mem_get_info",
                 "manual_seed", "manual_seed_all"):
        objects[f"torch.cuda.{name}"] = getattr(torch.cuda, name, None)
    for name in ("elapsed_time", "record", "synchronize", "query"):
        objects[f"torch.cuda.Event.{name}"] = getattr(torch.cuda.Event, name, None)
    for name in ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
                 "process_time", "sleep"):
        objects[f"time.{name}"] = getattr(time, name)
    for name in ("compare_outputs", "flatten_outputs", "first_mismatches"):
        objects[f"cutegen.evaluate.compare.{name}"] = getattr(compare, name, None)
    return objects


def _code_location(obj: Any) -> str:
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""


def _identity(obj: Any) -> str:
    """Who an object is: its type, qualified name, where its code lives, and its id (a replacement
    differs in at least one, even when it reuses a freed object's id).

    Bound methods (classmethods read from their class) are new objects on every read: their function
    is compared. torch wraps some of its own functions lazily (functools.wraps wrappers defined in
    torch itself, e.g. around torch.manual_seed); the wrapped function is compared then, so that
    torch's own re-wrapping is not a change. A wrapper whose code lives outside torch is reported.
    """

    obj = getattr(obj, "__func__", obj)
    try:
        inner = inspect.unwrap(obj)
    except ValueError:  # a __wrapped__ cycle: compare the outer object
        inner = obj
    wrapper = ""
    if inner is not obj and not _code_location(obj).startswith(_TORCH_DIR):
        wrapper = f" wrapped by {_code_location(obj) or type(obj).__name__}"
    qualname = getattr(inner, "__qualname__", getattr(inner, "__name__", ""))
    module = getattr(inner, "__module__", "")
    return f"{type(inner).__name__} {module}.{qualname} {_code_location(inner)}{wrapper} #{id(inner)}"


_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def snapshot_global_state() -> dict[str, str]:
    """Torch flags and the identities of commonly patched functions, as strings to compare later.

    Defeats a candidate that changes the rules while it runs: turning on TF32 or reduced-precision
    reductions (a free speedup against a strict fp32 baseline), switching the default dtype or grad
    mode, or replacing torch.allclose, torch.cuda.synchronize, CUDA event timing, time.perf_counter
    or the evaluator's own comparison. Take it before the candidate is imported and compare after
    every phase with `global_state_changes`.
    """
    state: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading the legacy TF32 flags next to the new API warns
        for key, read in _flag_readers().items():
            try:
                state[key] = repr(read())
            except (AttributeError, RuntimeError):
                state[key] = "<unavailable>"
    for key, obj in _watched_objects().items():
        state[key] = _identity(obj)
    return state


def global_state_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per setting or function that differs: "torch.backends.cuda.matmul.allow_tf32:
    False -> True"; function identities print as "replaced"."""
    changes = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, "<absent>"), after.get(key, "<absent>")
        if old != new:
            if "#" in old or "#" in new:
                changes.append(f"{key}: replaced ({old.split(' #')[0]} -> {new.split(' #')[0]})")
            else:
                changes.append(f"{key}: {old} -> {new}")
    return changes


# -------------------------------------------------------------------------------------- threads


def thread_snapshot() -> set[int]:
    """Identifiers of the Python threads alive now."""
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def new_threads(before: set[int]) -> list[str]:
    """Threads alive now that were not in `before` (from `thread_snapshot`), described by name.

    Defeats work finished after forward returns (a thread that fills the output later, so the timed
    region sees almost nothing) and helpers left running between calls.
    """
    return [
        f"{t.name} (daemon={t.daemon})"
        for t in threading.enumerate()
        if t.ident is not None and t.ident not in before and t.is_alive()
    ]


# -------------------------------------------------------------------------------------- outputs


def output_spec(ref_outputs: Any) -> Any:
    """What a correct output looks like (structure, and each tensor's shape, dtype, device and
    layout), as JSON: the candidate's worker checks its outputs against this without ever holding the
    reference's values."""
    if isinstance(ref_outputs, (tuple, list)):
        return {"sequence": [output_spec(r) for r in ref_outputs], "type": type(ref_outputs).__name__}
    if isinstance(ref_outputs, torch.Tensor):
        return {"tensor": {"shape": list(ref_outputs.shape), "dtype": str(ref_outputs.dtype),
                           "device": str(ref_outputs.device), "layout": str(ref_outputs.layout)}}
    return {"value": type(ref_outputs).__name__}


def check_output_types(outputs: Any, expected: Any) -> list[str]:
    """Problems with the structure and metadata of the outputs, one line each (empty when fine).

    Defeats tensor subclasses and lazy wrappers (a `__torch_function__` that makes comparisons pass,
    or work deferred until the result is read), a cheaper dtype (fp16 for an fp32 task), and wrong
    shapes, devices, layouts or structure (a tuple where the reference returns a tensor).
    Requires `type(x) is torch.Tensor` exactly. `expected` is the reference's output or its
    `output_spec`; the device is compared by type and index, so the reference's process may run on
    another copy of the same GPU.
    """
    spec = expected if _is_spec(expected) else output_spec(expected)
    return _type_problems(outputs, spec, "output")


def _is_spec(value: Any) -> bool:
    return isinstance(value, dict) and len(value) in (1, 2) and next(iter(value)) in ("sequence", "tensor", "value")


def _type_problems(out: Any, spec: dict[str, Any], where: str) -> list[str]:
    if "sequence" in spec:
        items = spec["sequence"]
        if not isinstance(out, (tuple, list)):
            return [f"{where}: a {type(out).__name__}, expected a sequence of {len(items)} items"]
        if len(out) != len(items):
            return [f"{where}: {len(out)} items, expected {len(items)}"]
        return [p for i, (o, s) in enumerate(zip(out, items)) for p in _type_problems(o, s, f"{where}[{i}]")]
    if "value" in spec:
        same = type(out).__name__ == spec["value"]
        return [] if same else [f"{where}: a {type(out).__name__}, expected a {spec['value']}"]
    if not isinstance(out, torch.Tensor):
        return [f"{where}: a {type(out).__name__}, expected a torch.Tensor"]
    if type(out) is not torch.Tensor:
        return [f"{where}: a {type(out).__module__}.{type(out).__qualname__}, expected exactly torch.Tensor"
                " (no subclasses or wrappers)"]
    want = spec["tensor"]
    got = {"shape": str(out.shape), "dtype": str(out.dtype), "device": str(out.device), "layout": str(out.layout)}
    expected = dict(want, shape=str(torch.Size(want["shape"])))
    return [f"{where}: {name} {got[name]}, expected {expected[name]}" for name in ("shape", "dtype", "device", "layout")
            if got[name] != expected[name]]


def check_nonfinite(outputs: Any, ref_outputs: Any) -> list[str]:
    """NaN or infinite output elements where the reference is finite, one line per output tensor.

    Defeats outputs that hold uninitialised memory (NaN after the memory churn) and numerically
    unsafe kernels (softmax without the max subtraction overflows on heavy-tailed inputs), which a
    comparison that skips NaN would let through.
    """
    problems = []
    pairs = zip(flatten_outputs(outputs), flatten_outputs(ref_outputs))
    for k, (out, ref) in enumerate(pairs):
        if not (isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)):
            continue
        if not (out.is_floating_point() or out.is_complex()) or out.shape != ref.shape:
            continue
        count, flat = _nonfinite_count(out.reshape(-1), ref.to(out.device).reshape(-1))
        if count:
            first = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), out.shape)) if out.dim() else ()
            problems.append(f"output[{k}]: {count} NaN/Inf elements where the reference is finite"
                            f" (first at {first})")
    return problems


def _nonfinite_count(out: Any, ref: Any) -> tuple[int, int]:
    """(elements non-finite in the flat `out` where the flat `ref` is finite, the index of the first),
    a chunk at a time, of the comparisons' size (compare.py): a whole bool mask summed as int64 took
    12 GiB for one 6.4 GB output of KernelBench level1/25 on the H200 (the sum widened the mask first)."""
    size = CUDA_CHUNK_ELEMENTS if out.device.type == "cuda" else CHUNK_ELEMENTS
    count, first = 0, -1
    for start in range(0, out.numel(), size):
        bad = ~torch.isfinite(out[start:start + size]) & torch.isfinite(ref[start:start + size])
        found = int(torch.count_nonzero(bad))
        if found and first < 0:
            # argmax, not nonzero(): a chunk full of NaN would make nonzero() list them all
            first = start + int(bad.to(torch.uint8).argmax())
        count += found
    return count, first


def inputs_mutated(before_clones: Sequence[Any], after: Sequence[Any]) -> list[int]:
    """Indices of inputs whose value, shape, dtype or strides differ from the clones taken before
    the candidate ran (NaN equals NaN).

    Defeats computing in place in the caller's input (saving an allocation and destroying data the
    caller still owns) and inputs rewritten to make a later comparison pass.
    """
    changed = []
    for i, (old, new) in enumerate(zip(before_clones, after)):
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
            if _tensor_changed(old, new):
                changed.append(i)
        elif old != new:
            changed.append(i)
    return changed


def _tensor_changed(old: torch.Tensor, new: torch.Tensor) -> bool:
    if old.shape != new.shape or old.dtype != new.dtype or old.stride() != new.stride():
        return True
    new = new.detach().to(old.device)
    same = old == new
    if old.is_floating_point() or old.is_complex():
        same |= torch.isnan(old) & torch.isnan(new)
    return not bool(same.all())


# ---------------------------------------------------------------------------------- ghost probe


def _cloned(inputs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _tensor_leaves(outputs: Any) -> list[torch.Tensor]:
    return [t.detach() for t in flatten_outputs(outputs) if isinstance(t, torch.Tensor)]


GHOST_REFERENCE_FACTOR = 10.0  # how far (in tolerances) a reference element must move to be judged
GHOST_CANDIDATE_FACTOR = 1.0  # how far the candidate's element must then move too


GHOST_DRAWS = 64  # positions drawn at random before a non-zero one is searched for


def ghost_perturbations(inputs: Sequence[Any]) -> list[tuple[int, int, float]]:
    """(input index, flat position, amount) for each float input that has a non-zero element: one
    non-zero element at a position the candidate cannot predict (`nonzero_position`), moved by
    8 x (max |x| + 1).

    Only non-zero elements are moved: a zero may be zero by the task's stated structure (the lower
    half of an upper-triangular matrix, KernelBench level1/14), and a kernel that skips it computes
    what the task asks. Moving it would give inputs the task never draws, and reject that honest
    kernel. A kernel that ignores input the task does draw (precomputed outputs, a skipped part of a
    dense input) is still seen: its non-zero elements are the ones moved."""
    plan = []
    for index, value in enumerate(inputs):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 0:
            position = nonzero_position(value.detach().reshape(-1))
            if position is not None:
                plan.append((index, position, 8.0 * (float(value.detach().abs().max()) + 1.0)))
    return plan


def nonzero_position(flat: torch.Tensor) -> int | None:
    """A flat position of a non-zero element (NaN counts), drawn with `secrets`: up to GHOST_DRAWS
    uniform draws (an input that is not mostly zero needs one or two), then the non-zero elements of
    a chunk from a random start on, wrapping around; None when every element is zero. Chunked, so a
    gigabyte input needs no index tensor of its own size."""
    for _ in range(GHOST_DRAWS):
        position = secrets.randbelow(flat.numel())
        if bool(flat[position] != 0):
            return position
    chunks = -(-flat.numel() // CHUNK_ELEMENTS)
    first = secrets.randbelow(chunks)
    for k in range(chunks):
        start = (first + k) % chunks * CHUNK_ELEMENTS
        found = torch.nonzero(flat[start:start + CHUNK_ELEMENTS]).reshape(-1)
        if found.numel():
            return start + int(found[secrets.randbelow(found.numel())])
    return None


def perturbed(inputs: Sequence[Any], index: int, position: int, delta: float) -> list[Any]:
    """A copy of the inputs with input `index` moved by `delta` at flat `position` (the same float
    addition in every process that applies it, so the reference's and the candidate's processes see
    the same perturbed input)."""
    changed = _cloned(inputs)
    tensor = changed[index].contiguous()
    changed[index] = tensor
    tensor.view(-1)[position] += delta
    return changed


def moved_mask(before: Any, after: Any, tol: float, factor: float) -> torch.Tensor | None:
    """Per element of all output leaves (flattened, concatenated): whether it moved by more than
    `factor` x (tol + tol * |before|); None when the shapes differ. Computed in float64 chunks on the
    outputs' device, so a gigabyte output needs no host copy and no float64 copy of itself."""

    olds, news = _tensor_leaves(before), _tensor_leaves(after)
    if len(olds) != len(news) or any(o.shape != n.shape for o, n in zip(olds, news)):
        return None
    parts = []
    for old, new in zip(olds, news):
        flat_old, flat_new = old.reshape(-1), new.reshape(-1).to(old.device)
        mask = torch.empty(flat_old.numel(), dtype=torch.bool, device=old.device)
        for start in range(0, flat_old.numel(), CHUNK_ELEMENTS):
            o = flat_old[start:start + CHUNK_ELEMENTS].to(torch.float64)
            n = flat_new[start:start + CHUNK_ELEMENTS].to(torch.float64)
            moved = torch.nan_to_num((n - o).abs() / (tol + tol * o.abs()), nan=0.0, posinf=1e30)
            mask[start:start + CHUNK_ELEMENTS] = moved > factor
        parts.append(mask)
    return torch.cat(parts) if len(parts) != 1 else parts[0]


def ghost_finding(index: int, position: int, candidate_moved: torch.Tensor | None,
                  reference_moved: torch.Tensor) -> str | None:
    """The ghost probe's judgement of one perturbed input: every element the reference moved (by
    GHOST_REFERENCE_FACTOR tolerances) must move in the candidate's output too."""
    if candidate_moved is None or candidate_moved.numel() != reference_moved.numel():
        return f"changing input {index} changed the shape of the candidate's output"
    reference_moved = reference_moved.to(candidate_moved.device)
    followed = int((candidate_moved & reference_moved).sum())
    expected = int(reference_moved.sum())
    if followed < expected:
        return (f"changing input {index} at flat position {position} moved {expected} reference"
                f" output elements, but only {followed} of the candidate's: its output does not"
                " depend on its inputs as the reference's does (precomputed or ignored input?)")
    return None


def ghost_probe(
    run_candidate: Callable[..., Any],
    run_reference: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    tol: float = 1e-4,
) -> str | None:
    """Why the candidate's output does not depend on its inputs, or None when it does (or when no
    float input moves the reference's output, so nothing can be judged).

    Defeats ghost kernels: outputs computed ahead of time (in __init__ from a guessed seed, or read
    from a file), and kernels that ignore part of their input. For each float input, one non-zero
    element at an unpredictable position is moved by a large amount (`ghost_perturbations`: zeros
    may be the task's structure, which a kernel may skip); wherever the
    reference's output moves by more than 10 x (tol + tol * |ref|), the candidate's must move by
    more than (tol + tol * |out|) too (`ghost_finding`), which any candidate within tolerance of the
    reference on both calls does. Pass the track's tolerance as `tol` (the larger of atol and rtol).
    `run_*` are called as `run(*inputs)` on fresh clones. The evaluator runs the same parts split
    between the reference's process and the candidate's (pipeline.py); this is them in one process.
    """
    base_ref = run_reference(*_cloned(inputs))
    base_cand = run_candidate(*_cloned(inputs))
    for index, position, delta in ghost_perturbations(inputs):
        changed = perturbed(inputs, index, position, delta)
        ref_moved = moved_mask(base_ref, run_reference(*_cloned(changed)), tol, GHOST_REFERENCE_FACTOR)
        if ref_moved is None or not bool(ref_moved.any()):
            continue
        cand_moved = moved_mask(base_cand, run_candidate(*_cloned(changed)), tol, GHOST_CANDIDATE_FACTOR)
        finding = ghost_finding(index, position, cand_moved, ref_moved)
        if finding:
            return finding
    return None


# ------------------------------------------------------------------------------------ memory churn

_CHURN_CHUNK_BYTES = 1 << 30
_CHURN_MIN_BYTES = 2 << 20


def churn_free_memory(device: torch.device | str) -> int:
    """Fill (nearly) all free device memory with NaN bytes, then give it back to the driver.

    Defeats the "stale memory" cheat (Sakana's AI CUDA Engineer): an output allocated with
    torch.empty that still holds the reference's result from a block the caching allocator handed
    back, so a kernel that computes only part of it passes. Cached blocks are released first, then
    blocks are taken (1 GiB, halving down to 2 MiB, until allocation fails) and every byte set to
    0xFF, which is NaN in fp32/fp16/bf16/fp64; finally everything is released again, so later
    allocations (the candidate's outputs) come from NaN-filled memory and no memory stays reserved.
    Best effort: memory another process or the driver holds cannot be reached. Does nothing for a
    non-CUDA device. Returns the bytes given back to the driver (which scrubs them: timing.wait_for_scrub).
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        cached = give_back_cached()
        blocks: list[torch.Tensor] = []
        chunk = _CHURN_CHUNK_BYTES
        while chunk >= _CHURN_MIN_BYTES:
            try:
                block = torch.empty(chunk, dtype=torch.uint8, device=device)
            except torch.cuda.OutOfMemoryError:
                chunk //= 2
                continue
            block.fill_(0xFF)
            blocks.append(block)
        torch.cuda.synchronize()
        del blocks
        return cached + give_back_cached()

