"""The candidate's worker: one fresh process per candidate, which never holds a reference output.

The parent sends `setup` (the task, the weight seeds and the reference's output spec: structure,
shapes, dtypes; nothing of the reference's values), then `build` (import the candidate, load its
kernels, which the build pool has usually compiled already), `weights`, and per correctness trial
`run_trial` with that trial's seed, sent only when the trial runs. The worker draws the trial's
inputs itself, on the device, from that seed (the reference process drew the same ones: their
fingerprints must match), runs the candidate on freshly churned memory, checks the outputs' types
against the spec and the inputs for mutation, and exports the outputs (transfer.py) for the
reference process to compare. `determinism`, `anticheat`, `ghost_run`, `timing` and `kernel_audit`
follow. Every reply carries raw measurements and the integrity snapshot (global state, threads)
taken before the candidate's import; the parent decides.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from cutegen.evaluate.anticheat import applies
from cutegen.evaluate.compare import compare_outputs, fingerprint, flatten_outputs
from cutegen.evaluate.confine import builds_torch_extension, confine_candidate, scratch_runtime
from cutegen.evaluate.context import CANDIDATE_FILE, Hooks, apply_track, runtime_from_json, task_from_json
from cutegen.evaluate.correctness import DETERMINISM_FACTOR, bitwise_equal, build_model, make_inputs, to_device
from cutegen.evaluate.guard import install as guard_install
from cutegen.evaluate.timing import give_back_cached, time_batch, wait_for_scrub, warm_up
from cutegen.evaluate.transfer import export_outputs
from cutegen.records import to_json
from cutegen.runtime import find_kernels, use_config
from cutegen.tasks import task_module

CANDIDATE_MODULE = "cutegen_candidate"


class CandidateSession:
    """The state one candidate's worker keeps."""

    def __init__(self, job: dict[str, Any]) -> None:
        import torch  # lazy: loading torch takes seconds

        # lazy: checks_dynamic loads torch
        from cutegen.evaluate.checks_dynamic import snapshot_global_state, thread_snapshot

        self.job = job
        self.device = torch.device("cuda", 0) if job["device"] == "cuda" else torch.device("cpu")
        self.hooks = Hooks(self.device)
        apply_track(job["track"])
        self.runtime = scratch_runtime(runtime_from_json(job.get("runtime")), Path.cwd())  # reads the shared cache
        self._config_scope = use_config(self.runtime)  # lazy builds in forward use it too
        self._config_scope.__enter__()
        self.task = task_from_json(job["task"])
        self.module = task_module(self.task)
        torch.manual_seed(job["init_seed"])
        self.init_inputs = list(self.module.get_init_inputs())
        self.candidate: Any = None
        self.models: dict[int, Any] = {}
        # What the reference process is reading, one group of tensors per exported output: kept until
        # the next command (`reexport` sends a group again as files, where CUDA IPC fails).
        self.exported: list[list[Any]] = []
        self.export_files: list[Path] = []  # the exports written as files, deleted with the groups
        self.transfer = job.get("transfer", "auto")
        self.retained: list[Any] = []  # the last timed batch's output copies, until the parent chooses
        self.idle_limit_ms: float | None = None
        self._null: Any = None
        self.workdir = Path.cwd()
        self._guard_readers: list[Any] = []  # the guard's reader, appended at the import (guard.py)
        self.state_before = snapshot_global_state()
        self.threads_before = thread_snapshot()

    def close(self) -> None:
        self._config_scope.__exit__(None, None, None)

    def _integrity(self) -> dict[str, Any]:
        """Global state and thread changes since the snapshot taken before the candidate's import."""
        # lazy: checks_dynamic loads torch
        from cutegen.evaluate.checks_dynamic import global_state_changes, new_threads, snapshot_global_state

        refusals = [r for reader in self._guard_readers for r in reader()]
        return {"state_changes": to_json(list(global_state_changes(self.state_before, snapshot_global_state()))),
                "new_threads": to_json(list(new_threads(self.threads_before))), "guard_refusals": refusals}

    def _export(self, outputs: Any) -> dict[str, Any]:
        descriptor, keep = export_outputs(flatten_outputs(outputs), self.workdir, via=self.transfer)
        self.exported.append(keep)
        self._note_files(descriptor)
        return {**descriptor, "group": len(self.exported) - 1}

    def _note_files(self, descriptor: dict[str, Any]) -> None:
        self.export_files += [Path(leaf["path"]) for leaf in descriptor["leaves"] if leaf.get("kind") == "file"]

    def reexport(self, payload: dict[str, Any]) -> dict[str, Any]:
        """An exported group of outputs again, as files (after the reference process could not open
        it by CUDA IPC); later exports of this worker use files too."""

        self.transfer = "file"
        descriptor, _ = export_outputs(self.exported[int(payload["group"])], self.workdir, via="file")
        self._note_files(descriptor)
        return {**descriptor, "group": int(payload["group"])}

    def _inputs(self, spec: dict[str, Any]) -> list[Any]:
        """A trial's inputs, drawn here from its seed as the reference process drew them."""

        strength = tuple(spec["strength"]) if spec.get("strength") else None
        return make_inputs(self.module, spec["seed"], strength, self.device, self.device)

    def _model(self, weight: int) -> Any:
        return self.models[weight]

    def release(self) -> None:
        """The reference process is done with the last exports. Their files go too: a run's timed
        batches each export, and files of gigabyte outputs kept to the worker's end would fill the disk."""
        self.exported.clear()
        for path in self.export_files:
            path.unlink(missing_ok=True)
        self.export_files.clear()

    # -- the candidate

    def build(self, payload: dict[str, Any]) -> dict[str, Any]:
        import torch  # lazy: loading torch takes seconds

        started = time.perf_counter()
        self.candidate, kernels = import_and_build(payload["source"], self.runtime, self.job.get("guard", True),
                                                   self._guard_readers, landlock=self.job.get("landlock", True))
        model_new = getattr(self.candidate, "ModelNew", None)
        has_model = isinstance(model_new, type) and issubclass(model_new, torch.nn.Module)
        return {"build_s": time.perf_counter() - started, "kernels": kernels, "model_new": has_model,
                **self._integrity()}

    def weights(self) -> dict[str, Any]:
        """ModelNew built per weight seed exactly as the reference's Model was, and the fingerprints
        of its parameters and buffers (compared by name with the reference's in the parent)."""

        prints = []
        for k, seed in enumerate(self.job["weight_seeds"]):
            self.models[k] = build_model(self.candidate.ModelNew, self.init_inputs, seed, self.device)
            prints.append({name: fingerprint(t) for name, t in self.models[k].state_dict().items()})
        return {"weights": prints, **self._integrity()}

    def run_trial(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One correctness call: inputs drawn from the trial's seed, memory churned first when asked,
        the outputs' types checked against the reference's spec, the inputs checked for mutation,
        the outputs exported for the reference process."""
        import torch  # lazy: loading torch takes seconds

        # lazy: checks_dynamic loads torch
        from cutegen.evaluate.checks_dynamic import check_output_types, inputs_mutated

        self.release()
        inputs = self._inputs(payload)
        prints = ([fingerprint(x) if isinstance(x, torch.Tensor) else repr(x) for x in inputs]
                  if payload.get("fingerprint") else None)
        pristine = to_device(inputs, self.device)
        if payload.get("churn"):
            self.hooks.churn()
        with torch.no_grad():
            out = self._model(payload["weight"])(*inputs)
        self.hooks.synchronize()
        problems = check_output_types(out, self.job["spec"])
        findings = [{"check": "check_output_types", "message": p, "line": None} for p in problems]
        mutated = [i for i in inputs_mutated(pristine, inputs) if i not in payload.get("ref_mutates", [])]
        del pristine, inputs
        descriptor = None if problems else self._export(out)
        return {"fingerprints": prints, "findings": findings, "mutated": mutated, "outputs": descriptor,
                **self._integrity()}

    def determinism(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The candidate twice on identical inputs, with memory churned before each call; the two
        outputs are compared here (no reference is involved)."""
        import torch  # lazy: loading torch takes seconds

        self.release()
        inputs = self._inputs(payload)
        outs = []
        for _ in range(2):
            args = to_device(inputs, self.device)
            self.hooks.churn()
            with torch.no_grad():
                outs.append(self._model(payload["weight"])(*args))
            self.hooks.synchronize()
            del args
        first, second = outs
        atol, rtol = payload["atol"] * DETERMINISM_FACTOR, payload["rtol"] * DETERMINISM_FACTOR
        tight = compare_outputs(flatten_outputs(second), flatten_outputs(first), atol, rtol)
        return to_json({"bitwise": bitwise_equal(first, second), "errors": tight, **self._integrity()})

    def anticheat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The op audit (where anticheat.DYNAMIC_CHECK_BACKENDS applies it): every aten op of one forward."""
        import torch  # lazy: loading torch takes seconds

        from cutegen.evaluate import checks_dynamic as dyn  # lazy: checks_dynamic loads torch

        self.release()
        result: dict[str, Any] = {}
        if applies("disallowed_ops", self.job["backend"]):
            inputs = self._inputs(payload)
            with dyn.OpAudit() as audit, torch.no_grad():
                self._model(payload["weight"])(*inputs)
            self.hooks.synchronize()
            result["ops"] = sorted(set(audit.ops))
            result["disallowed_ops"] = dyn.disallowed_ops(audit.ops, self.job["backend"])
        return to_json({**result, **self._integrity()})

    def ghost_run(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The candidate's half of one ghost perturbation: its outputs on trial 0's inputs and on the
        same inputs with one element moved (checks_dynamic.perturbed), both exported."""
        import torch  # lazy: loading torch takes seconds

        from cutegen.evaluate.checks_dynamic import check_output_types, perturbed  # lazy: checks_dynamic loads torch

        self.release()
        self.hooks.churn()  # the reference process has just released its perturbed forwards' memory
        inputs = self._inputs(payload)
        model = self._model(payload["weight"])
        with torch.no_grad():
            base = model(*to_device(inputs, self.device))
            moved = model(*perturbed(inputs, payload["index"], payload["position"], payload["delta"]))
        self.hooks.synchronize()
        if check_output_types(moved, self.job["spec"]):  # a changed shape: the reference says so
            return {"base": self._export(base), "perturbed": {"leaves": []}, **self._integrity()}
        return {"base": self._export(base), "perturbed": self._export(moved), **self._integrity()}

    # -- timing: calibrated before the candidate's import, then timed batches on fresh inputs

    def _draw(self, seeds: list[int]) -> Any:
        """Call i's inputs, drawn on the device from seeds[i] (the reference process can draw them again)."""

        return lambda i: make_inputs(self.module, int(seeds[i]), None, self.device, self.device)

    def _batch_reply(self, run: Any) -> dict[str, Any]:
        self.retained = run.retained
        return to_json({"times_ms": run.times_ms, "stream_ms": run.stream_ms, "idle_ms": run.idle_ms,
                        **self._integrity()})

    def calibrate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Before the candidate is imported (the parent refuses it after): the batch size that fits,
        and batches of the timing loop around a forward that only allocates the outputs, each timed
        by the parent on its own clock. What the parent measures beyond the reported times here is
        the judge's own cost per call (drawing inputs, flushing, copying outputs, the round trip)."""

        if self.candidate is not None:
            raise RuntimeError("calibrate must run before the candidate is imported")
        calls = self._batch_calls(int(payload["calls"]))
        null = _null_forward(self.job["spec"], self.device)
        self.idle_limit_ms = warm_up(null, self._draw(payload["warmup_seeds"]), device=self.device,
                                     calls=len(payload["warmup_seeds"]))
        self._null = null
        return {"calls": calls, "idle_limit_ms": self.idle_limit_ms}

    def calibration_batch(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.candidate is not None:
            raise RuntimeError("calibration batches must run before the candidate is imported")
        self.release()
        run = time_batch(self._null, self._draw(payload["seeds"]), device=self.device,
                         calls=len(payload["seeds"]), idle_limit_ms=self.idle_limit_ms)
        return self._batch_reply(run)

    def _batch_calls(self, wanted: int) -> int:
        """At most `wanted` calls per batch, and no more retained output copies than a quarter of the
        device's free memory holds (one at least)."""
        import torch  # lazy: loading torch takes seconds

        if self.device.type != "cuda":
            return max(1, wanted)
        free, _ = torch.cuda.mem_get_info(self.device)
        return max(1, min(wanted, int(free // 4 // max(1, _spec_bytes(self.job["spec"])))))

    def timing_warmup(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The candidate's untimed warm-up calls on inputs of their own; free memory is churned first
        (the correctness calls' outputs are freed: no stale result survives into the timed calls).
        The warm-up runs while the driver scrubs what the churn and the reference process (its
        `give_back`, `freed_bytes` here) gave back; the rest of the scrub is waited for after it."""

        self.release()
        began = time.perf_counter()
        freed = int(payload.get("freed_bytes", 0)) + self.hooks.churn()
        limit = warm_up(self._model(0), self._draw(payload["seeds"]), device=self.device, calls=len(payload["seeds"]))
        if self.idle_limit_ms is None:
            self.idle_limit_ms = limit
        waited = wait_for_scrub(freed, time.perf_counter() - began)  # nothing freed on a CPU: no wait
        return {"idle_limit_ms": self.idle_limit_ms, "scrub_wait_s": waited, **self._integrity()}

    def timed_batch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One batch of timed calls (timing.time_batch), each on inputs from its own seed; the copies of
        the outputs stay here until `export_timed`."""

        self.release()
        run = time_batch(self._model(0), self._draw(payload["seeds"]), device=self.device,
                         calls=len(payload["seeds"]), idle_limit_ms=self.idle_limit_ms)
        return self._batch_reply(run)

    def export_timed(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The retained outputs of the calls the parent chose after the batch, exported for the
        reference process; the other copies are dropped."""
        chosen = [int(i) for i in payload["calls"]]
        exported = {str(i): self._export(self.retained[i]) for i in chosen}
        self.retained = []
        return {"outputs": exported}

    def free_cached(self) -> dict[str, Any]:
        """The device memory this worker's allocator caches (a batch's freed inputs, outputs and copies)
        back to the driver, for the reference process's comparison, which runs the reference on fresh
        inputs beside it (KernelBench's 8.6 GB tasks left it 7 GiB on an H200); the exports stay.
        Returns once the driver's scrub of those blocks is over, so that it does not slow the next
        batch's timed calls (timing.wait_for_scrub)."""
        if self.device.type == "cuda":
            wait_for_scrub(give_back_cached(), 0.0)
        return {}

    def kernel_audit(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The kernels one forward launches (the parent asks for it on CUDA when own kernels are
        required); run last: see anticheat.py."""
        import torch  # lazy: loading torch takes seconds

        from cutegen.evaluate import checks_dynamic as dyn  # lazy: checks_dynamic loads torch

        self.release()
        inputs = self._inputs(payload)
        model = self._model(payload["weight"])

        def forward(*xs: Any) -> Any:
            with torch.no_grad():
                return model(*xs)

        return to_json({"kernels": dyn.audit_kernels(forward, inputs), **self._integrity()})


def _spec_bytes(spec: Any) -> int:
    """Bytes of the outputs an `output_spec` describes."""
    import torch  # lazy: loading torch takes seconds

    if "sequence" in spec:
        return sum(_spec_bytes(s) for s in spec["sequence"])
    if "tensor" in spec:
        t = spec["tensor"]
        dtype = getattr(torch, t["dtype"].removeprefix("torch."))
        numel = 1
        for n in t["shape"]:
            numel *= int(n)
        return numel * torch.empty((), dtype=dtype).element_size()
    return 0


def _null_forward(spec: Any, device: Any) -> Any:
    """A forward that only allocates (and zeroes) outputs of the spec's structure, shapes and dtypes: the timing
    loop's own cost per call is measured around it."""
    import torch  # lazy: loading torch takes seconds

    def make(s: Any) -> Any:
        if "sequence" in s:
            items = [make(x) for x in s["sequence"]]
            return tuple(items) if s.get("type") == "tuple" else items
        if "tensor" in s:
            t = s["tensor"]
            # Written, as a forward writes its outputs: first-touch costs fall inside the call, as they do there.
            return torch.zeros(t["shape"], dtype=getattr(torch, t["dtype"].removeprefix("torch.")), device=device)
        return None

    return lambda *inputs: make(spec)


def import_and_build(source: str, runtime: Any, guard: bool = True, readers: list[Any] | None = None, *,
                     landlock: bool = True, build: bool = True) -> tuple[Any, list[dict[str, Any]]]:
    """Import the candidate from a file in the working directory and build each of its CuTe kernels.

    A KernelBench-style candidate that calls `load_inline` at import builds during the import; the
    parent's build timeout covers both. With `guard`, the judge's audit hook (guard.py) is installed
    first, and the reader of its refusals is appended to `readers` (a list the caller made before any
    candidate code ran, and holds where that code cannot reach it); then the process is confined
    (confine.py; Landlock where the kernel has it and `landlock`): it writes only in its working
    directory and the candidate's own build folder. The evaluator's build cache is read, never
    written: a kernel missing there is built in the working directory. With `build` False (the
    build pool's worker) nothing is built: each kernel's name and source are returned, for the
    evaluator to build into its cache.
    """

    runtime = scratch_runtime(runtime, Path.cwd())
    path = Path.cwd() / CANDIDATE_FILE
    path.write_text(source, encoding="utf-8")
    if builds_torch_extension(source):
        # torch's extension builder imports setuptools, and setuptools finds `distutils` (gone from the
        # standard library in Python 3.12) through a meta-path finder that swallows every error: under
        # the guard that lookup failed on the H200 (ModuleNotFoundError for an honest load_inline
        # candidate). Imported here, before the guard, it is the judge's import, not the candidate's.
        importlib.import_module("torch.utils.cpp_extension")
    if guard:
        reader = guard_install(str(path), Path.cwd())  # in a build worker a refusal raises, and the build reports it
        if readers is not None:
            readers.append(reader)
    confine_candidate(source, runtime, Path.cwd(), enforce=landlock)  # the kernel's own limit, hook or no hook
    spec = importlib.util.spec_from_file_location(CANDIDATE_MODULE, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[CANDIDATE_MODULE] = module
    with use_config(runtime):  # a build during the import, too, reads the shared cache and writes here
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    if not build:
        return module, [{"name": kernel.name, "source": kernel.source} for kernel in find_kernels(module)]
    kernels = []
    for kernel in find_kernels(module):
        result = kernel.build(runtime)
        kernels.append({"name": kernel.name, "cached": result.cached, "compile_s": result.compile_s,
                        "arch": result.arch})
    return module, kernels
