"""The instruction mix of a candidate's kernels, from their SASS (`cuobjdump -sass` of the built library).

Counts are static (instructions in the code, not executed): enough to tell whether a kernel can use
tensor cores at all (HGMMA for wgmma, HMMA for mma.sync) or only FFMA, how wide its global accesses
are (LDG.E.128 is a 128-bit vector access), whether it uses cp.async (LDGSTS), ldmatrix (LDSM) or
TMA, and whether it spills (LDL/STL). The classic silent failure this catches: a kernel written for
wgmma built for plain sm_90 instead of sm_90a has no HGMMA at all (CuTe compiles the GMMA atom to a
trap), yet compiles and may even pass with a fallback.

An opcode is classified by its base mnemonic (before the first dot): "HFMA2.MMA" is an HFMA2 the
compiler issues on the MMA pipe to move constants, not a tensor-core MMA.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cutegen.profile.diagnose import terms
from cutegen.records import InstructionMix

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
# "/*0a30*/  @!P0 LDG.E.128.CONSTANT R4, desc[UR6][R2.64] ;" -> opcode "LDG.E.128.CONSTANT"
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")
_OTHER_MMA = frozenset({"IMMA", "DMMA", "BMMA", "IGMMA", "QGMMA", "BGMMA", "OMMA", "QMMA", "UTCHMMA", "UTCQMMA",
                        "UTCIMMA", "UTCOMMA"})
_TMA = frozenset({"UTMALDG", "UTMASTG", "UTMAREDG", "UTMAPF", "UBLKCP", "UBLKRED", "UBLKPF"})
_WIDTHS = {"128": 128, "64": 64, "U8": 8, "S8": 8, "U16": 16, "S16": 16}

# What a source asks for: GMMA atoms / wgmma need HGMMA; mma.sync atoms need HMMA (or IMMA...).
WGMMA_INTENT = re.compile(r"\bSM90_\d+x\d+x\d+\w*|\bGMMA::|\bwgmma\b|\bwarpgroup_arrive\b")
MMA_SYNC_INTENT = re.compile(r"\bSM(?:70|75|80|89)_\d+x\d+x\d+_\w+|\bmma\.sync\b")


@dataclass
class _Counts:
    total: int = 0
    by_base: dict[str, int] = field(default_factory=dict)
    widest_load: int | None = None
    widest_store: int | None = None


def _width(modifiers: list[str]) -> int:
    return max((_WIDTHS[m] for m in modifiers if m in _WIDTHS), default=32)


def _add(counts: _Counts, opcode: str) -> None:
    base, *modifiers = opcode.split(".")
    if base == "NOP":
        return
    counts.total += 1
    counts.by_base[base] = counts.by_base.get(base, 0) + 1
    if base in ("LDG", "LD"):
        counts.widest_load = max(counts.widest_load or 0, _width(modifiers))
    elif base in ("STG", "ST"):
        counts.widest_store = max(counts.widest_store or 0, _width(modifiers))


def _mix(function: str, counts: _Counts) -> InstructionMix:
    n = counts.by_base.get
    return InstructionMix(
        function=function, instructions=counts.total, hgmma=n("HGMMA", 0), hmma=n("HMMA", 0),
        other_mma=sum(n(op, 0) for op in _OTHER_MMA), ffma=n("FFMA", 0), fp32_other=n("FADD", 0) + n("FMUL", 0),
        global_loads=n("LDG", 0) + n("LD", 0), global_stores=n("STG", 0) + n("ST", 0),
        widest_global_load_bits=counts.widest_load, widest_global_store_bits=counts.widest_store,
        shared_loads=n("LDS", 0), shared_stores=n("STS", 0), ldmatrix=n("LDSM", 0), cp_async=n("LDGSTS", 0),
        tma=sum(n(op, 0) for op in _TMA), local_memory=n("LDL", 0) + n("STL", 0), shuffles=n("SHFL", 0),
        barriers=n("BAR", 0),
    )


def parse_sass(text: str) -> tuple[InstructionMix, ...]:
    """One InstructionMix per kernel function in `cuobjdump -sass` output, in order of appearance
    (a function listed again, in another cubin of the same library, keeps its first listing)."""
    functions: dict[str, _Counts] = {}
    current: _Counts | None = None
    for line in text.splitlines():
        header = _FUNCTION.match(line)
        if header:
            name = header.group(1)
            current = functions.setdefault(name, _Counts()) if name not in functions else None
            continue
        if current is not None:
            match = _INSTRUCTION.match(line)
            if match:
                _add(current, match.group(1))
    return tuple(_mix(name, counts) for name, counts in functions.items())


def run_cuobjdump(cuobjdump: str, library: Path, timeout_s: float) -> str:
    """`cuobjdump -sass LIBRARY`; nvdisasm (which it calls) is looked up beside cuobjdump first."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(cuobjdump).parent), env.get("PATH", "")) if p)
    done = subprocess.run([cuobjdump, "-sass", str(library)], capture_output=True, text=True, timeout=timeout_s,
                          env=env, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {library.name} failed (exit {done.returncode}):"
                           f" {(done.stderr or done.stdout).strip()[-400:]}")
    return done.stdout


def mix_findings(mixes: tuple[InstructionMix, ...], source: str, workload_class: str | None,
                 track: str, backend: str = "cute") -> tuple[str, ...]:
    """Warnings about the compiled code that a model should act on (empty when nothing is off), in the
    backend's terms (diagnose.TERMS)."""

    if not mixes:
        return ()
    t = terms(backend)
    findings = []
    hgmma = sum(m.hgmma for m in mixes)
    warp_mma = sum(m.hmma + m.other_mma for m in mixes)
    if WGMMA_INTENT.search(source) and hgmma == 0:
        findings.append(f"The source {t['wgmma_named']} but the SASS has no HGMMA instruction: the"
                        " wgmma path was compiled away (plain sm_90 instead of sm_90a does this silently) or"
                        f" is never reached. Build for sm_90a and {t['wgmma_fix']}.")
    if MMA_SYNC_INTENT.search(source) and warp_mma == 0:
        findings.append(f"The source {t['mma_sync_named']} but the SASS has no HMMA:"
                        " the tensor-core path is compiled out or never instantiated.")
    if workload_class in ("gemm", "conv", "attention") and hgmma + warp_mma == 0:
        ffma = sum(m.ffma for m in mixes)
        route = t["fp32_mma_route"] if track == "fp32" else t["tf32_mma_route"]
        findings.append(f"No tensor-core instruction in the code (FFMA only: {ffma} FFMA): this {workload_class}"
                        f" runs on CUDA cores; {route}.")
    spills = sum(m.local_memory for m in mixes)
    if spills:
        findings.append(f"{spills} local-memory instructions (LDL/STL): register spills or a run-time indexed"
                        f" local array; index register fragments with compile-time constants ({t['unroll']}) or"
                        " shrink the per-thread tile.")
    return tuple(findings)
