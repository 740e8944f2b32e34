"""The evaluator: everything that runs or inspects untrusted candidate code lives in this subpackage.

The pipeline (pipeline.py, one entry point: `evaluate_candidate`) runs the static checks in the
parent, the build in a CPU pool, and the rest on a GPU lane of the evaluation service (service.py):
the candidate in a fresh worker process (runner.py), its outputs compared in the task's reference
process (reference.py), which computes a task's trial inputs, reference outputs, float64 results and
trivial-solution probe once per run and GPU and serves every candidate of the task. Processes and
their protocol: worker.py (processes), protocol.py (commands), context.py (what a job sets up),
transfer.py (outputs between them), jobs.py (what each job is told). Executors hand whole
evaluations to this machine's service (executor.py) or to one service per GPU of a Ray cluster
(ray_executor.py). The judging of each stage: checks_static, correctness, compare,
anticheat/checks_dynamic, timing, baselines, sol, probe;
verdict.py assembles the Verdict.

Threat analysis of the per-task reference process (EVALUATION.md's guarantees, as it keeps them):

- The candidate cannot read reference outputs through the Python heap: they exist only in the
  reference process, which never imports a candidate (protocol.py refuses a candidate's job in a
  worker that holds a reference, and the reverse).
- Nor through device memory: the reference process never exports memory; the candidate's process
  exports its outputs (transfer.py) and the reference process maps them, read-only in intent, for
  one comparison. The reference process keeps freed device blocks in its own allocator while it
  serves candidates, except where the candidate's next call churns (reference.ReferenceSession.
  _empty_cache: after the ghost probe's perturbed forwards, which would otherwise hold tens of GB
  of a gigabyte task, and in `give_back`, right before the candidate's timing), and each candidate's
  first correctness call, its determinism calls, its ghost-probe calls and its timing run on
  NaN-churned memory, so stale device memory holds nothing of the reference's. A timed call's
  comparison (compare_fresh) gives its blocks back between the timed batches only where the device
  is short of room; what they held answers that call's inputs, which no later call gets.
- Fresh inputs: the candidate's worker draws every trial's inputs itself from the trial's seed,
  which reaches it only when that trial runs; their fingerprints must equal the reference's draw
  (a mismatch is the task's error: get_inputs() that does not depend on the seed alone).
- Seeds stay fresh per run (os.urandom in the parent); a reference process lives at most for one
  run (one Evaluator), and the ghost probe's perturbations are drawn anew for every candidate.
  A reference prepared ahead (service.Evaluator.prepare, while the task's candidate builds in the
  CPU pool, whose workers never touch the device) is the same process, started earlier: it holds
  the lane as an evaluation would, so nothing of a candidate runs on the GPU beside its trials or
  baselines.
- A forged output descriptor (a candidate that patches the worker's code) can at worst make the
  reference process fail or die: its shape and dtype are checked before anything is mapped, the
  parent then fails the candidate and replaces the reference process (`Lane.drop`).
- Nor through another process's memory: the reference process makes itself non-dumpable
  (reference._not_dumpable), so a process of the same user cannot ptrace it or read /proc/PID/mem.
- Not defended (as everywhere in this harness, which is no security sandbox): a candidate running
  as root can still read any process's memory, and any candidate can read the files its user can
  read. Run untrusted code from unknown sources in a container or VM.
"""
