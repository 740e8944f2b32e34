"""Handing a candidate's outputs to the reference process, which alone holds the reference outputs.

The candidate's worker exports the output tensors of one call (`export_outputs`) and sends the
parent a JSON descriptor; the parent passes it to the task's reference process, which opens it
(`open_outputs`), compares, and closes it. Nothing flows the other way: the reference process never
exports memory, so no handle, file or address of it ever reaches a candidate's process.

- On a CUDA device the outputs are shared by CUDA IPC (`cudaIpcGetMemHandle` through torch's storage
  sharing, as torch.multiprocessing does): the reference process maps the candidate's device memory
  and reads the outputs in place, device to device, with no host copy of gigabyte outputs. The
  mapping covers the candidate's whole allocation segment, which holds nothing of the reference's.
- On the CPU each output is written to a file in the candidate's working directory and mapped by the
  reference process (`torch.from_file`); that directory is removed with the worker. The file's room is
  reserved before it is mapped: a full disk is then a `TransferSpaceError` (the machine's, not the
  candidate's), not a bus error that ends the worker as a crash.
- Where CUDA IPC cannot open an output, the reader raises `IpcOpenError`, and only that makes the
  parent ask for the outputs again as files (pipeline.py).
- Every export is read: an export the reference does not compare is let go (`let_go`), which maps and
  drops its CUDA IPC leaves. torch frees an exported block only once a shared counter says every reader
  has dropped it, and a block no reader ever mapped stays held until the exporting process ends (on an
  H200, the 6 GiB timed outputs of KernelBench level1/25 that were exported and not compared piled up
  to 48 GiB in the candidate's worker, and honest candidates ran out of memory). The exporting worker
  deletes its output files when the reference is done with them (runner.py, `release`).

A descriptor is data from an untrusted process: the reader checks every leaf's dtype, shape and size
against the reference's before it maps anything, so a forged size or shape is refused rather than
read past (a forged CUDA IPC handle can still break the reader's CUDA context: the parent then
replaces the reference process and fails the candidate).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import math
import os
import uuid
from pathlib import Path
from typing import Any, Iterator

_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "complex64", "complex128")


def _dtype(name: str) -> Any:
    import torch  # lazy: loading torch takes seconds

    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} cannot be transferred")
    return getattr(torch, name)


def dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def export_outputs(leaves: list[Any], folder: Path, via: str = "auto") -> tuple[dict[str, Any], list[Any]]:
    """(descriptor, what the caller must keep alive until the reader is done) for output tensors.

    Each leaf is exported contiguous (a non-contiguous output is copied once): the reader compares
    elementwise by shape, never by strides. `via`: "auto" (CUDA IPC for device tensors, files for
    host ones) or "file" (files for all: the fallback where CUDA IPC fails). `folder` receives the
    files."""
    import torch  # lazy: loading torch takes seconds

    described, keep = [], []
    for leaf in leaves:
        tensor = leaf.detach()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        keep.append(tensor)
        entry = {"dtype": dtype_name(tensor), "shape": list(tensor.shape)}
        if tensor.device.type == "cuda" and via == "auto":
            entry.update(_export_cuda(tensor))
        else:
            entry.update(_export_file(tensor, folder))
        described.append(entry)
    if any(t.device.type == "cuda" for t in keep):
        torch.cuda.synchronize()  # the reader's stream must find the outputs complete
    return {"leaves": described}, keep


def uses_ipc(descriptor: Any) -> bool:
    return any(isinstance(e, dict) and e.get("kind") == "cuda_ipc" for e in (descriptor or {}).get("leaves", []))


def _export_cuda(tensor: Any) -> dict[str, Any]:
    if tensor.numel() == 0:
        return {"kind": "empty"}
    storage = tensor.untyped_storage()
    (device, handle, size_bytes, offset_bytes, counter_handle, counter_offset, event_handle,
     event_sync) = storage._share_cuda_()
    return {"kind": "cuda_ipc", "device": int(device), "handle": _b64(handle), "storage_bytes": int(size_bytes),
            "storage_offset_bytes": int(offset_bytes), "counter_handle": _b64(counter_handle),
            "counter_offset": int(counter_offset), "event_handle": _b64(event_handle),
            "event_sync": bool(event_sync), "element_offset": int(tensor.storage_offset())}


def _export_file(tensor: Any, folder: Path) -> dict[str, Any]:
    import torch  # lazy: loading torch takes seconds

    if tensor.numel() == 0:
        return {"kind": "empty"}
    path = Path(folder) / f"out-{uuid.uuid4().hex}.bin"
    nbytes = tensor.numel() * tensor.element_size()
    with open(path, "wb") as handle:
        # Reserved, not only sized: writing a mapped page of a sparse file on a full disk raises SIGBUS,
        # which would end the worker and read as the candidate's crash (seen on the H200 with 8.6 GB
        # outputs of KernelBench level1/38).
        try:
            os.posix_fallocate(handle.fileno(), 0, nbytes)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            path.unlink(missing_ok=True)
            raise TransferSpaceError(f"no room for a {nbytes / 2**30:.2f} GiB output file in {folder}:"
                                     f" {os.strerror(err.errno)}") from None
    mapped = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
    mapped.view(tensor.dtype).view(tensor.shape).copy_(tensor)
    del mapped
    return {"kind": "file", "path": str(path), "bytes": nbytes}


class TransferError(Exception):
    """A descriptor that does not describe outputs the reference can compare (the candidate's)."""


class IpcOpenError(Exception):
    """CUDA IPC could not map an output: a system that does not allow it, or a forged handle. The
    parent then asks for the same outputs as files."""


class TransferSpaceError(Exception):
    """No room on the working directory's file system for an output file: the machine's problem (an
    infrastructure verdict), not the candidate's."""


@contextlib.contextmanager
def open_outputs(descriptor: Any, expected: list[dict[str, Any]], device: Any) -> Iterator[list[Any]]:
    """The output tensors a descriptor names, readable in this process until the block ends.

    `expected` is the reference's leaf list (dtype and shape of each); a descriptor that differs in
    count, dtype or shape raises TransferError before anything is mapped (check_output_types has
    already told the candidate's worker why)."""
    leaves = _checked(descriptor, expected)
    opened = []
    try:
        for entry in leaves:
            opened.append(_open_leaf(entry, device))
        yield opened
    finally:
        del opened[:]


def let_go(descriptor: Any, expected: list[dict[str, Any]], device: Any) -> None:
    """Map and drop at once the CUDA IPC leaves of exported outputs that will not be compared, so that
    the exporter's memory is freed (module docstring); files and empty leaves need nothing here. A
    descriptor is checked as `open_outputs` checks it."""
    for entry in _checked(descriptor, expected):
        if entry.get("kind") == "cuda_ipc":
            _open_leaf(entry, device)  # dropped at once: the reader's release is what frees it


def _checked(descriptor: Any, expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The descriptor's leaves, each of the reference's dtype and shape, or TransferError."""
    leaves = descriptor.get("leaves") if isinstance(descriptor, dict) else None
    if not isinstance(leaves, list) or len(leaves) != len(expected):
        raise TransferError("the outputs' descriptor does not list one entry per reference output")
    for entry, want in zip(leaves, expected):
        if not isinstance(entry, dict):
            raise TransferError("an output's entry in the descriptor is not an object")
        if entry.get("dtype") != want["dtype"] or entry.get("shape") != list(want["shape"]):
            raise TransferError(f"an output is {entry.get('dtype')} {entry.get('shape')}, the reference's"
                                f" {want['dtype']} {want['shape']}")
    return leaves


def _open_leaf(entry: dict[str, Any], device: Any) -> Any:
    import torch  # lazy: loading torch takes seconds

    dtype, shape = _dtype(entry["dtype"]), [int(s) for s in entry["shape"]]
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    kind = entry.get("kind")
    if kind == "empty" or numel == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    if kind == "file":
        path = Path(str(entry.get("path")))
        if int(entry.get("bytes", -1)) != nbytes or not path.is_file() or path.stat().st_size < nbytes:
            raise TransferError("an output file is missing or shorter than the output it should hold")
        flat = torch.from_file(str(path), shared=False, size=nbytes, dtype=torch.uint8)
        return flat.view(dtype).view(shape).to(device)
    if kind == "cuda_ipc":
        offset = int(entry["element_offset"])
        if offset < 0 or (offset + numel) * (nbytes // numel) > int(entry["storage_bytes"]):
            raise TransferError("an output's storage is smaller than the output")
        try:
            storage = torch.UntypedStorage._new_shared_cuda(
                int(entry["device"]), _unb64(entry["handle"]), int(entry["storage_bytes"]),
                int(entry["storage_offset_bytes"]), _unb64(entry["counter_handle"]), int(entry["counter_offset"]),
                _unb64(entry["event_handle"]), bool(entry["event_sync"]))
        except RuntimeError as err:
            raise IpcOpenError(f"CUDA IPC could not open an output: {err}") from None
        return torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, shape)
    raise TransferError(f"unknown output transfer kind {kind!r}")

