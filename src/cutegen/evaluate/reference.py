"""The reference process's side of evaluations: a task's reference work, done once and kept.

A worker that takes a `reference` job becomes the task's reference process for the run on its GPU
(service.py starts and keeps it). It draws every correctness trial's inputs from the seeds the
parent sends (on the device: milliseconds even for KernelBench's gigabyte inputs), runs the
reference, keeps the outputs on the device, probes the task for trivial solutions, and reports only
what a candidate may know: the outputs' structure, shapes and dtypes, the tolerance, which trials
were made milder, and fingerprints of the inputs and weights (compare.fingerprint) so that the
candidate's process can check that it drew the same inputs from the same seeds. It then serves every
candidate of the task: `compare` opens a candidate's exported outputs (transfer.py) and compares
them with the kept reference on the device; `ghost_plan` and `ghost_judge` run the reference's half
of the ghost probe with fresh perturbations per candidate; `baseline` times eager and torch.compile
on the kept timing inputs. The float64 result of a trial, which only widens the tolerance where
PyTorch's own rounding is the larger error, is computed the first time a comparison of that trial
needs it and kept.

This process never imports a candidate and never exports memory; a candidate's process never holds
a reference output, on the host or on the device. The threat analysis is in service.py.
Every command replies with measurements; the parent decides the verdict.
"""

from __future__ import annotations

import ctypes
import gc
import math
import sys
import time
from typing import Any

from cutegen.evaluate import correctness as c
from cutegen.evaluate.compare import compare_outputs, compare_precision, fingerprint, first_mismatches, flatten_outputs
from cutegen.evaluate.context import apply_track, task_from_json
from cutegen.evaluate.correctness import (
    ENVELOPE_MAX_FRACTION, exact_delta, exact_model, make_inputs, precision_basis, reference_trial, rounding_slack,
    unpredictable_seed,
)
from cutegen.evaluate.probe import trivial_solution_probe
from cutegen.evaluate.timing import compile_reference, give_back_cached, time_baseline
from cutegen.evaluate.transfer import TransferError, let_go, open_outputs
from cutegen.records import to_json
from cutegen.tasks import task_module

OOM_RETRY_S = 3.0  # before a reference that ran out of device memory tries again there
# compare_fresh keeps its cached blocks for the next comparison (the same sizes again) while at least
# this share of the device's memory is free and none of the task's comparisons ran out of memory. The
# worker frees nothing between timed batches, so its next batch needs no more room than it already
# holds unless it gave its blocks back for a comparison; the share is a cushion for the allocators'
# rounding and for other processes. Blocks given back would be scrubbed by the driver, which the parent
# waits out before the next batch (timing.wait_for_scrub: 1.5 s of a 6 s evaluation of KernelBench
# level1/47 on the H200, 0.9 s of level1/48's).
KEEP_CACHE_FREE_SHARE = 0.1


def _model_class(module: Any) -> Any:
    return module.Model


def _not_dumpable() -> None:
    """Mark this process non-dumpable (Linux prctl PR_SET_DUMPABLE 0): another process of the same
    user, a candidate's among them, can then neither ptrace it nor read /proc/PID/mem, where the
    reference outputs are (root still can). Elsewhere nothing happens."""

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        except (OSError, AttributeError):
            pass


class ReferenceSession:
    """The state a task's reference process keeps between candidates."""

    def __init__(self, job: dict[str, Any]) -> None:
        import torch  # lazy: loading torch takes seconds

        self.job = job
        self.device = torch.device("cuda", 0) if job["device"] == "cuda" else torch.device("cpu")
        # A timed call's comparison ran out of memory, here or in the parent's first attempt (the
        # worker gave its blocks back then): from then on, for every later candidate of the task too,
        # a comparison gives its blocks back (_short_of_room).
        self.comparisons_short = False
        if not job.get("reusable"):
            _not_dumpable()
        apply_track(job["track"])
        # A baseline job's worker may take the next task: what the task's code changes from here on
        # must not reach it (see protocol._cmd_release).
        self.state_at_start = self._global_state() if job.get("reusable") else None
        self.task = task_from_json(job["task"])
        self.module = task_module(self.task)
        self.home = self.device  # where reference outputs are kept (the host when the device is full)
        self.models: list[Any] = []
        self.trials: list[Any] = []
        self.leaves: list[dict[str, Any]] = []
        self.atol = self.rtol = 0.0
        self.deltas: dict[int, Any] = {}
        self.delta_notes: dict[int, str | None] = {}
        self.models64: dict[int, Any] = {}
        self.bases: dict[int, Any] = {}  # trial index -> correctness.precision_basis, made once
        self.basis_notes: dict[int, str | None] = {}
        self.dtype = "float32"  # the dtype whose tolerance applies (correctness.lowest_precision)
        self.ghost_masks: dict[int, Any] = {}
        self.timing_indices: list[int] = []
        self.compiled: tuple[Any, str | None] | None = None

    def close(self) -> None:
        pass

    @staticmethod
    def _global_state() -> dict[str, str]:
        from cutegen.evaluate.checks_dynamic import snapshot_global_state  # lazy: checks_dynamic loads torch

        return snapshot_global_state()

    def state_changes(self) -> list[str]:
        """What a reusable job's task changed in torch's global state since the job began."""
        from cutegen.evaluate.checks_dynamic import global_state_changes  # lazy: checks_dynamic loads torch

        if self.state_at_start is None:
            return []
        return global_state_changes(self.state_at_start, self._global_state())

    # -- the reference, once

    def reference(self) -> dict[str, Any]:
        import torch  # lazy: loading torch takes seconds

        for attempt in range(2):
            try:
                return self._reference()
            except torch.cuda.OutOfMemoryError:
                self.trials = []
                torch.cuda.empty_cache()
                if attempt == 0:  # a process that held gigabytes may still be ending: once more, later
                    time.sleep(OOM_RETRY_S)
        # Gigabyte outputs of many trials may not fit beside the candidate's working set: keep them
        # on the host, where comparisons read them chunk by chunk (each verdict says so).
        self.home = torch.device("cpu")
        return self._reference()

    def _reference(self) -> dict[str, Any]:
        import torch  # lazy: loading torch takes seconds

        from cutegen.evaluate.checks_dynamic import output_spec  # lazy: checks_dynamic loads torch

        job = self.job
        torch.manual_seed(job["init_seed"])
        self.init_inputs = list(self.module.get_init_inputs())
        self.models = [c.build_model(_model_class(self.module), self.init_inputs, w, self.device)
                       for w in job["weight_seeds"]]
        weights = [{name: fingerprint(t) for name, t in m.state_dict().items()} for m in self.models]
        # One trial at a time: its inputs are described, probed and dropped before the next is drawn
        # (trial 0's feed the ghost probe, the timing sets' the baselines), so that a task with
        # gigabyte inputs holds every trial's outputs but only the inputs it keeps.
        self.trials, self.timing_indices, described, degenerate = [], [], [], None
        self.bases, self.basis_notes = {}, {}
        clean_finite = True
        for index, plan in enumerate(job["trials"]):
            trial = c.reference_trial(self.module, self.models[plan["weight"]], plan, self.device, clean_finite,
                                      self.home)
            self.trials.append(trial)
            if index == 0:
                first, clean_finite = trial, c.all_finite(trial.reference)
                leaves = flatten_outputs(first.reference)
                if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
                    raise TypeError("the reference's forward must return a tensor or a tuple/list of tensors")
                self.leaves = [{"dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape)} for x in leaves]
                dtype = c.lowest_precision(c.tensors_of(first.inputs) + c.tensors_of(first.reference))
                self.atol, self.rtol = job["tolerances"][dtype]
                self.dtype = dtype
            described.append(self._describe(index, trial))
            if trial.reference is not None and self.precision_rule() is None:
                self._basis(index, ahead=True)
            if trial.adversarial or trial.reference is None:
                if index != 0:
                    trial.inputs = None
                continue
            if job.get("probe") and (degenerate is None or degenerate):
                degenerate = self._probe(trial, degenerate)
            if trial.weight == 0 and len(self.timing_indices) < max(1, job["timing"]["input_sets"]):
                self.timing_indices.append(index)
            elif index != 0:
                trial.inputs = None
        if job.get("probe") and degenerate is None:
            degenerate = []
        self._empty_cache()
        return {"dtype": dtype, "atol": self.atol, "rtol": self.rtol, "degenerate": degenerate,
                "spec": output_spec(first.reference), "leaves": self.leaves, "trials": described,
                "weights": weights, "timing_trials": self.timing_indices, "home": str(self.home),
                "memory_bytes": self.memory_bytes()}

    def _describe(self, index: int, trial: Any) -> dict[str, Any]:
        import torch  # lazy: loading torch takes seconds

        prints = [fingerprint(x) if isinstance(x, torch.Tensor) else repr(x) for x in (trial.inputs or [])]
        trial.fingerprints = prints
        return {"index": index, "weight": trial.weight, "adversarial": trial.adversarial,
                "strength": list(trial.strength) if trial.strength else None,
                "skipped": trial.reference is None, "note": trial.note, "ref_mutates": list(trial.ref_mutates),
                "fingerprints": prints}

    def _probe(self, trial: Any, names: list[str] | None) -> list[str]:
        """The trivial answers (zeros, a constant, an input) among `names` (all, when None) that pass
        this clean trial's reference: over the trials, those that pass every one."""

        passing = list(trivial_solution_probe(trial.reference, trial.inputs, self.atol, self.rtol))
        return passing if names is None else [n for n in names if n in passing]

    def memory_bytes(self) -> int:
        """Device memory this process holds (its allocator's reserve included)."""
        import torch  # lazy: loading torch takes seconds

        return int(torch.cuda.memory_reserved()) if self.device.type == "cuda" else 0

    def _empty_cache(self) -> int:
        """Give cached device memory back to the driver: only where the candidate's worker churns all
        free memory before its next call (at the end of `reference` and `trim`, before a candidate's
        first trial; at the end of `ghost_plan`, before its ghost_run; `give_back`, before its
        timing), and after a `compare_fresh` of a timed call where the device is short of room.
        Otherwise, while candidates are served, freed blocks (float64 chunks of reference outputs
        among them) stay in this process's allocator, out of a candidate's reach. Returns the
        bytes given back, which the driver then scrubs (timing.wait_for_scrub)."""
        return give_back_cached() if self.device.type == "cuda" else 0

    # -- serving candidates

    def compare(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A candidate's outputs for trial `payload["trial"]` against the kept reference: non-finite
        elements where the reference is finite, the tolerance rule (with the trial's float64 result
        when the plain rule fails somewhere, and its rounding drawn again when a few elements still
        fail: compare.py), and the first mismatching elements."""
        from cutegen.evaluate.checks_dynamic import check_nonfinite  # lazy: checks_dynamic loads torch

        index = int(payload["trial"])
        trial = self.trials[index]
        refs = flatten_outputs(trial.reference)
        delta = slack = None
        with open_outputs(payload["outputs"], self.leaves, self.device) as outs:
            stats = compare_outputs(outs, refs, self.atol, self.rtol)
            # No error at all: every element equals the reference's, NaN and infinities where it has them.
            problems = [] if stats.max_abs_error == 0 else check_nonfinite(outs, refs)
            findings = [{"check": "check_nonfinite", "message": p, "line": None} for p in problems]
            if stats.mismatched_elements and self.job.get("exact", True):
                delta = self._delta(index)
            if delta is not None:
                stats = compare_outputs(outs, refs, self.atol, self.rtol, delta)
                if 0 < stats.mismatched_elements <= ENVELOPE_MAX_FRACTION * stats.total_elements:
                    slack = self._slack(index, delta)
            if slack is not None:
                stats = compare_outputs(outs, refs, self.atol, self.rtol, delta, slack)
            mismatches = (list(first_mismatches(outs, refs, self.atol, self.rtol, ref_delta=delta, ref_slack=slack))
                          if stats.mismatched_elements else [])
            precision, precision_note = self._precision(index, outs, refs, stats)
        slack_used = slack is not None
        del slack  # as large as the output: made again for the next candidate that needs it
        return to_json({"findings": findings, "errors": stats, "first_mismatches": mismatches,
                        "exact_note": self.delta_notes.get(index), "exact_used": delta is not None,
                        "slack_used": slack_used, "precision": precision, "precision_note": precision_note,
                        "memory_bytes": self.memory_bytes()})

    def precision_rule(self) -> str | None:
        """Why the fp32 track's precision rule (compare.judge_precision) does not judge this task's
        candidates, or None when it does: the tf32 track keeps its own tolerance, half-precision
        tasks their dtype's, and outputs other than float32 have no fp32 reference error to compare."""
        if self.job["track"] != "fp32":
            return f"the {self.job['track']} track keeps its tolerance (atol = rtol = {self.atol:g})"
        if self.dtype != "float32":
            return f"{self.dtype} tensors keep their dtype's tolerance (atol = rtol = {self.atol:g})"
        if any(leaf["dtype"] != "float32" for leaf in self.leaves):
            return "outputs other than float32"
        if not self.job.get("exact", True):
            return "no float64 results in this job"
        return None

    def _precision(self, index: int, outs: Any, refs: list[Any], stats: Any) -> tuple[Any, str | None]:
        """(per output leaf, compare.compare_precision of the candidate's outputs, or None; why not).
        An output equal to the reference everywhere is as precise as it: [] without a float64 run."""

        why = self.precision_rule()
        if why is not None or stats.max_abs_error == math.inf:
            return None, why
        if stats.max_abs_error == 0:
            return [], None
        basis = self._basis(index)
        if basis is None:
            return None, self.basis_notes.get(index)
        return compare_precision(outs, refs, basis, self.atol, self.rtol), None

    def _basis(self, index: int, ahead: bool = False) -> Any:
        """The trial's float64 basis for the precision rule (correctness.precision_basis), made once,
        on a sample drawn from a seed no candidate sees. Made `ahead` for each correctness trial while
        the reference is computed, before any candidate runs: a candidate that holds the device's
        memory cannot then deny the rule its float64 results. Running out of memory there is not
        kept: the comparison tries again."""
        import torch  # lazy: loading torch takes seconds

        if index not in self.basis_notes:
            trial = self.trials[index]
            if trial.weight not in self.models64:
                self.models64[trial.weight] = exact_model(self.models[trial.weight])
            try:
                basis, note = precision_basis(self.models64[trial.weight], self._inputs(index), trial.reference,
                                              self.device, unpredictable_seed())
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                if ahead:
                    return None
                basis, note = None, "no device memory left for the float64 result"
            self.bases[index], self.basis_notes[index] = basis, note
        return self.bases[index]

    def compare_fresh(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A timed call's outputs (chosen by the parent after the call ran) against the reference run
        now on the same inputs, drawn from the call's seed, by the rule of `compare`. The trial lives
        only for this comparison. Its memory goes back to the driver after it where the device is short
        of room (`freed_bytes`, which the driver scrubs: the parent waits for that before the next
        timed batch); otherwise the next comparison reuses it (KEEP_CACHE_FREE_SHARE)."""

        import torch  # lazy: loading torch takes seconds

        seed = int(payload["seed"])
        plan = {"seed": seed, "weight": 0, "adversarial": False}
        index = len(self.trials)
        started = time.perf_counter()
        try:
            self.trials.append(self._fresh_trial(plan))
            trial_s = time.perf_counter() - started  # the rest of the reply's time is the comparison's
            result = {**self.compare({"trial": index, "outputs": payload["outputs"]}), "trial_s": trial_s}
        except torch.cuda.OutOfMemoryError:
            self.comparisons_short = True  # the worker gives its blocks back (the parent's `room`)
            raise
        finally:
            del self.trials[index:]
            self.deltas.pop(index, None)
            self.delta_notes.pop(index, None)
            self.bases.pop(index, None)
            self.basis_notes.pop(index, None)
            # Back to the driver when the candidate's later batches may need the room. Kept, a block
            # still holds this call's reference output, which answers inputs no later call gets.
            freed = self._empty_cache() if self._short_of_room() else 0
        return {**result, "freed_bytes": freed, "memory_bytes": self.memory_bytes()}  # after the give-back

    def _short_of_room(self) -> bool:
        """Whether a timed call's comparison gives its blocks back (KEEP_CACHE_FREE_SHARE): one of the
        task's comparisons ran out of device memory, or less than that share of it is free. Never on a
        CPU."""
        import torch  # lazy: loading torch takes seconds

        if self.device.type != "cuda":
            return False
        if self.comparisons_short:
            return True
        free, total = torch.cuda.mem_get_info(self.device)
        return free < KEEP_CACHE_FREE_SHARE * total

    def let_go(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A timed call's exported outputs that the parent chose not to compare: read as far as the
        exporter needs to free them (transfer.let_go), never compared."""
        let_go(payload["outputs"], self.leaves, self.device)
        return {"memory_bytes": self.memory_bytes()}

    def _fresh_trial(self, plan: dict[str, Any]) -> Any:
        """A timed call's trial, kept on the device while it fits there even where the kept trials live
        on the host (`home`): it lives for one comparison, and on the host each one copied gigabytes
        over PCIe four times (1.4 s a comparison, 14 s an evaluation of KernelBench level1/23 on the
        H200, bench/results part K). Out of device memory, it is made on the host after all."""
        import torch  # lazy: loading torch takes seconds

        if self.home != self.device:
            try:
                return reference_trial(self.module, self.models[0], plan, self.device, True, self.device)
            except torch.cuda.OutOfMemoryError:
                self.comparisons_short = True
                self._empty_cache()
        return reference_trial(self.module, self.models[0], plan, self.device, True, self.home)

    def _inputs(self, index: int) -> list[Any]:
        """Trial `index`'s inputs: kept, or drawn again from its seed (and checked to be the same)."""

        import torch  # lazy: loading torch takes seconds

        trial = self.trials[index]
        if trial.inputs is not None:
            return trial.inputs
        inputs = make_inputs(self.module, trial.seed, trial.strength, self.device, self.device)
        prints = [fingerprint(x) if isinstance(x, torch.Tensor) else repr(x) for x in inputs]
        if prints != trial.fingerprints:
            raise RuntimeError(f"trial {index}'s inputs drawn again differ from the first draw: the task's"
                               " get_inputs() does not depend on the seed alone")
        return inputs

    def _delta(self, index: int) -> Any:
        """The trial's float64 result minus its reference (correctness.exact_delta), made once."""
        import torch  # lazy: loading torch takes seconds

        if index not in self.delta_notes:
            trial = self.trials[index]
            if trial.weight not in self.models64:
                self.models64[trial.weight] = exact_model(self.models[trial.weight])
            try:
                delta, note = exact_delta(self.models64[trial.weight], self._inputs(index), trial.reference,
                                          self.device)
            except torch.cuda.OutOfMemoryError:
                delta, note = None, "no device memory left for the float64 result"
            self.deltas[index], self.delta_notes[index] = delta, note
        return self.deltas[index]

    def _slack(self, index: int, delta: Any) -> Any:
        """The trial's rounding slack (correctness.rounding_slack), or None; not kept (as large as the
        output, and needed only where a few elements fail the single delta)."""

        trial = self.trials[index]
        slack, _ = rounding_slack(self.models[trial.weight], self.models64.get(trial.weight), self._inputs(index),
                                  trial.reference, delta, self.device, trial.seed)
        return slack

    def ghost_plan(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The reference's half of the ghost probe for one candidate: fresh perturbations of trial
        0's inputs (checks_dynamic.ghost_perturbations) and, for each that moves the reference's
        output, the mask of moved elements (kept for `ghost_judge`)."""
        import torch  # lazy: loading torch takes seconds

        from cutegen.evaluate import checks_dynamic as dyn  # lazy: checks_dynamic loads torch

        tol = float(payload["tol"])
        trial = self.trials[0]
        inputs, model = self._inputs(0), self.models[trial.weight]
        self.ghost_masks, plan = {}, []
        for index, position, delta in dyn.ghost_perturbations(inputs):
            with torch.no_grad():
                out = model(*dyn.perturbed(inputs, index, position, delta))
            mask = dyn.moved_mask(trial.reference, out, tol, dyn.GHOST_REFERENCE_FACTOR)
            del out
            if mask is not None and bool(mask.any()):
                self.ghost_masks[index] = mask
                plan.append({"index": index, "position": position, "delta": delta})
        # The perturbed forwards' memory (a copy of the inputs, the output and the forward's
        # temporaries: tens of GB for KernelBench's largest tasks, which left an honest candidate's
        # timing without memory) goes back to the driver; the candidate's ghost_run, next, churns
        # free memory before anything of it runs, so no perturbed output survives there.
        self._empty_cache()
        return {"plan": plan, "memory_bytes": self.memory_bytes()}

    def give_back(self) -> dict[str, Any]:
        """Before the candidate's timing, which churns free memory before its first timed call: the
        blocks cached by the comparisons and the ghost probe's judgements go back to the driver. On
        an H200 the reference processes of KernelBench's 8 GB tasks reported 96 GiB at this point,
        and honest candidates ran out of memory in timing beside them. `freed_bytes`: what went back,
        which the driver then scrubs while the candidate's first calls run (timing.wait_for_scrub)."""
        freed = self._empty_cache()
        return {"memory_bytes": self.memory_bytes(), "freed_bytes": freed}

    def ghost_judge(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The candidate's outputs before and after one perturbation against the reference's mask."""
        from cutegen.evaluate import checks_dynamic as dyn  # lazy: checks_dynamic loads torch

        index, position = int(payload["index"]), int(payload["position"])
        try:
            with open_outputs(payload["base"], self.leaves, self.device) as base, \
                    open_outputs(payload["perturbed"], self.leaves, self.device) as moved:
                candidate = dyn.moved_mask(base, moved, float(payload["tol"]), dyn.GHOST_CANDIDATE_FACTOR)
        except TransferError:
            candidate = None
        return {"finding": dyn.ghost_finding(index, position, candidate, self.ghost_masks[index]),
                "memory_bytes": self.memory_bytes()}

    # -- baselines and the device's peaks

    def baseline(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`kind`: "compile" (torch.compile and its first call), "eager" (timed twice) or "compiled"
        (timed; compiled first if "compile" was not asked for). Timed on the kept timing inputs."""

        sets = [self.trials[i].inputs for i in self.timing_indices]
        model, kind = self.models[0], payload["kind"]
        spec = payload.get("timing") or self.job["timing"]  # the asking evaluation's trials and warm-up

        def timed(fn: Any) -> list[float]:
            return time_baseline(fn, sets, self.device, spec)

        if kind == "eager":
            return {"eager": timed(model), "eager_repeat": timed(model)}
        if self.compiled is None:
            self.compiled = compile_reference(model, sets)
        compiled, error = self.compiled
        if kind == "compile" or compiled is None:
            return {"compiled": None, "compile_error": error}
        return {"compiled": timed(compiled), "compile_error": None}

    def trim(self) -> dict[str, Any]:
        """After the baselines: drop the timing inputs and the compiled model (trial 0's inputs stay,
        for the ghost probe); returns the device memory still held."""

        for i, trial in enumerate(self.trials):
            if i != 0:
                trial.inputs = None
        self.compiled = None
        gc.collect()
        self._empty_cache()
        return {"memory_bytes": self.memory_bytes()}
