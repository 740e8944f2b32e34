"""Trace a reference on meta tensors: which aten ops run, how many FLOPs, how many bytes must move.

The reference is built and run under `torch.device("meta")`, so no memory is allocated and no math is
done: a task with 6 GB of inputs traces in milliseconds. FLOPs come from
`torch.utils.flop_counter.FlopCounterMode` (2*M*N*K for a matmul; it counts nothing for ops such as
layer_norm or softmax, which are bounded by bytes anyway). The workload class is derived from the ops,
never asked of a model.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Any, Iterator

from cutegen.errors import TaskError
from cutegen.records import Task, TaskTrace
from cutegen.tasks import task_module

# Op families by aten op name (the overload-free packet name). Ops absent from every family are
# classified by their tags: pointwise ops are elementwise, anything else that computes is "other".
_GEMM = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear",
         "_addmm_activation", "einsum", "tensordot", "outer", "ger", "addr"}
_CONV = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
         "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution_overrideable"}
_ATTENTION = {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_cudnn_attention", "scaled_dot_product_attention",
              "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_fused_attention_overrideable",
              "_safe_softmax"}  # _safe_softmax: only the math decomposition of SDPA uses it
_NORM = {"native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
         "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
         "native_group_norm", "_fused_rms_norm", "rms_norm", "instance_norm", "batch_norm",
         "layer_norm", "group_norm"}
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "_softmax",
              "_log_softmax", "softmax", "log_softmax", "cumsum", "cumprod", "var", "std", "var_mean",
              "std_mean", "logsumexp", "norm", "linalg_vector_norm", "any", "all", "logcumsumexp",
              "max_pool1d", "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d",
              "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "_adaptive_avg_pool2d",
              "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d", "max_pool2d",
              "max_pool3d", "cummax", "cummin", "nll_loss_forward", "nll_loss2d_forward",
              "smooth_l1_loss", "huber_loss", "mse_loss", "l1_loss", "kl_div", "binary_cross_entropy",
              "binary_cross_entropy_with_logits", "_cdist_forward", "cosine_similarity"}
# Moves data without computing: never a compute op, never affects the class.
_DATA_MOVEMENT = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
                  "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones",
                  "new_full", "clone", "copy_", "_to_copy", "to", "contiguous", "detach", "alias",
                  "lift_fresh", "_unsafe_view", "scalar_tensor", "arange", "fill_", "zero_",
                  "cat", "stack", "split", "split_with_sizes", "chunk", "unbind", "index_select",
                  "gather", "constant_pad_nd", "pad", "flip", "roll", "repeat", "tril", "triu",
                  "diag", "diag_embed", "diagonal", "narrow", "select_scatter", "slice_scatter",
                  "_local_scalar_dense", "rand", "randn", "randint", "rand_like", "randn_like",
                  "bernoulli", "bernoulli_", "normal", "uniform_", "normal_", "masked_fill", "where"}


def _packet_name(func: Any) -> str:
    # str() is "aten.mm.default" for an OpOverload and "aten.mm" for the packet FlopCounterMode keys by.
    return str(func).split(".")[1]


def _family(func: Any) -> str | None:
    import torch  # lazy: loading torch takes seconds

    name = _packet_name(func)
    base = name.rstrip("_") if name.endswith("_") and not name.startswith("_") else name
    for family, names in (("attention", _ATTENTION), ("gemm", _GEMM), ("conv", _CONV),
                          ("norm", _NORM), ("reduction", _REDUCTION)):
        if name in names or base in names:
            return family
    if name in _DATA_MOVEMENT or base in _DATA_MOVEMENT or torch.Tag.view_copy in func.tags:
        return None
    if func.is_view or torch.Tag.core not in func.tags and torch.Tag.pointwise not in func.tags:
        # Views and shape-only ops (expand, permute, reshape...) move no data; unknown non-core ops
        # that are not pointwise fall through to "other" below only if they are not views.
        return None if func.is_view else "other"
    if torch.Tag.pointwise in func.tags:
        return "elementwise"
    return "other"


def classify(families: list[str], ops: list[str], anchor_family: str | None) -> str:
    """The workload class from the op families seen, in order of what dominates a kernel's design.

    A GEMM or convolution with any other compute op around it is a fused chain (the knowledge pack
    for it starts from the anchor op's class, which the trace keeps as `anchor_op`).
    """
    seen = set(families)
    if "attention" in seen or (families.count("gemm") >= 2 and "_softmax" in ops):
        # Fused SDPA, or written out as QK^T -> softmax -> PV.
        return "attention"
    heavy = seen & {"gemm", "conv"}
    if heavy:
        if len(heavy) > 1 or seen - heavy:
            return "fused_chain"
        return anchor_family or heavy.pop()
    for family in ("norm", "reduction", "other", "elementwise"):
        if family in seen:
            return family
    return "other"  # nothing computes: a pure copy/view task


def _tensors(obj: Any) -> list[Any]:
    import torch  # lazy: loading torch takes seconds

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    return []


def _nbytes(tensors: list[Any]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        key = id(t)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def trace_task(task: Task) -> TaskTrace:
    """Run the reference once on meta tensors and summarise it; a failure is recorded, not raised.

    The task module is loaded for real (a task that cannot load raises TaskError); only the
    construction of the model, the inputs and the forward pass happen on the meta device.
    """
    module = task_module(task)
    try:
        return _trace_module(module)
    except TaskError:
        raise
    except Exception as err:  # data-dependent control flow, .item(), ops without a meta kernel
        message = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
        return TaskTrace((), None, None, None, None, "other", None, error=message)


_QUIET = threading.Lock()


class _QuietThreads:
    """sys.stdout while some thread is inside `quiet_stdout`: that thread's writes are dropped, every
    other thread's go on to the stream this one stands in for (all else is delegated to it)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.depth: dict[int, int] = {}  # thread ident -> nesting depth of its quiet blocks

    def write(self, text: str) -> int:
        if threading.get_ident() in self.depth:
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """The calling thread's writes to sys.stdout swallowed for the block; other threads' lines still
    print. redirect_stdout would swap the process-wide attribute for everyone: a bench's progress
    line printed by the main thread while a service thread traces a task was lost, and two
    overlapping blocks could leave a StringIO there for good. Instead one stand-in that filters by
    thread is installed while any thread is quiet, and the original put back when the last leaves."""
    me = threading.get_ident()
    with _QUIET:
        proxy = sys.stdout if isinstance(sys.stdout, _QuietThreads) else _QuietThreads(sys.stdout)
        sys.stdout = proxy
        proxy.depth[me] = proxy.depth.get(me, 0) + 1
    try:
        yield
    finally:
        with _QUIET:
            proxy.depth[me] -= 1
            if not proxy.depth[me]:
                del proxy.depth[me]
            if not proxy.depth and sys.stdout is proxy:  # left alone if someone replaced it meanwhile
                sys.stdout = proxy.stream


def _trace_module(module: Any) -> TaskTrace:
    import torch  # lazy: loading torch takes seconds
    from torch.utils._python_dispatch import TorchDispatchMode  # lazy: loading torch takes seconds
    from torch.utils.flop_counter import FlopCounterMode  # lazy: loading torch takes seconds

    calls: list[Any] = []

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))

    # The task may print or warn while building; keep the listing clean.
    with quiet_stdout(), warnings.catch_warnings(), torch.device("meta"), torch.no_grad():
        warnings.simplefilter("ignore")
        init_inputs = module.get_init_inputs()
        model = module.Model(*init_inputs)
        inputs = module.get_inputs()
        counter = FlopCounterMode(display=False)
        with counter, _Recorder():
            outputs = model(*inputs)
    weights = list(model.parameters()) + list(model.buffers())
    return _summarise(calls, counter, _tensors(inputs), weights, _tensors(outputs))


def _summarise(calls: list[Any], counter: Any, inputs: list, weights: list, outputs: list) -> TaskTrace:
    ops: list[str] = []
    families: list[str] = []
    for func in calls:
        family = _family(func)
        if family is None:
            continue
        name = _packet_name(func)
        if name not in ops:
            ops.append(name)
        families.append(family)
    flop_counts = {
        _packet_name(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()
    }
    family_of = {_packet_name(f): _family(f) for f in calls}
    if flop_counts:
        anchor = max(flop_counts, key=flop_counts.get)
        workload = classify(families, ops, family_of.get(anchor))
    else:
        workload = classify(families, ops, None)
        if workload == "reduction" and _is_normalisation(ops, family_of, inputs, outputs):
            workload = "norm"
        anchor = next((op for op in ops if family_of[op] == workload), ops[0] if ops else None)
    return TaskTrace(
        aten_ops=tuple(ops),
        flops=int(counter.get_total_flops()),
        input_bytes=_nbytes(inputs),
        param_bytes=_nbytes(weights),
        output_bytes=_nbytes(outputs),
        workload_class=workload,
        anchor_op=anchor,
        output_dtypes=tuple(dict.fromkeys(str(t.dtype).removeprefix("torch.") for t in outputs
                                          if t.is_floating_point())),
    )


_STATISTICS = {"mean", "var", "std", "var_mean", "std_mean", "sum", "norm", "linalg_vector_norm"}


def _is_normalisation(ops: list[str], family_of: dict, inputs: list, outputs: list) -> bool:
    """A hand-written norm (x / ||x||, RMSNorm...): statistics reduced, then an output shaped like x."""
    reductions = {op for op in ops if family_of[op] == "reduction"}
    same_shape = bool(inputs) and any(o.shape == inputs[0].shape for o in outputs)
    return bool(reductions) and reductions <= _STATISTICS and same_shape
