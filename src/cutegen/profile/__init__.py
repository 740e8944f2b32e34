"""cutegen.profile: Nsight Compute feedback on a candidate, short and in units a model can act on.

    from cutegen.profile import ProfileConfig, profile_candidate, profile_text, make_profiler

    profile = profile_candidate(Path("candidate.py"), task, ProfileConfig(), eval_config)
    print(profile_text(profile))          # what the agent's optimize prompt shows
    agent = Agent(..., profiler=make_profiler())

run.py runs ncu (isolated like an evaluation worker) and builds the Profile; driver.py is the profiled
process; ncu_csv.py reads ncu's CSV with its units; metrics.py is the metric set; sass.py the
instruction mix from cuobjdump; diagnose.py the diagnosis, the suggestions and the text.
Importing this package starts no process and imports no torch.
"""

from cutegen.config import ProfileConfig
from cutegen.profile.diagnose import build_profile, diagnose, profile_text
from cutegen.profile.ncu_csv import Launch, NcuCsvError, parse_ncu_csv, to_base, unit_scale
from cutegen.profile.run import (
    NcuProfiler,
    ProfileUnavailable,
    collect,
    interpret,
    make_profiler,
    profile_candidate,
)
from cutegen.profile.sass import mix_findings, parse_sass

__all__ = [
    "Launch",
    "NcuCsvError",
    "NcuProfiler",
    "ProfileConfig",
    "ProfileUnavailable",
    "build_profile",
    "collect",
    "diagnose",
    "interpret",
    "make_profiler",
    "mix_findings",
    "parse_ncu_csv",
    "parse_sass",
    "profile_candidate",
    "profile_text",
    "to_base",
    "unit_scale",
]
