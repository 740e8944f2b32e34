"""A survey of a task suite on this machine (`cutegen survey`): the eager and torch.compile baselines
of each precision track, by the evaluator's own protocol, the speed-of-light bound and the fraction of
it each baseline reaches, and the trivial-solution flags of every task, in one resumable file.

probe.py runs a task's trivial-solution probe and checks the flags against the tasks known to be
degenerate; table.py is the file (resume, merge, what is left, the summary); markdown.py its table;
measure.py measures one (task, track) and precompiles a chunk; run.py is the loop over chunks.
"""

from cutegen.survey.run import SurveyConfig, run_survey
from cutegen.survey.table import Wanted

__all__ = ["SurveyConfig", "Wanted", "run_survey"]
