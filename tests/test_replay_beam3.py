"""examples/replays/beam3_torch.jsonl is well-formed for the run it was recorded for (tests/test_beam_gpu.py):
`--search beam:2,3 --rounds 2 --repairs 1` over swish_scale, row_softmax and layer_norm, torch backend.
No evaluation here: the run itself is the bench script's (`--device cpu` on a CPU, about 2 minutes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cutegen.config import search_policy
from cutegen.extract import extract_candidate
from cutegen.llm.files import ReplayProvider
from cutegen.prompt import parse_directions

REPO = Path(__file__).resolve().parents[1]
REPLAY = REPO / "examples" / "replays" / "beam3_torch.jsonl"
TASKS = ("swish_scale", "row_softmax", "layer_norm")
SEARCH, ROUNDS, REPAIRS = "beam:2,3", 2, 1
# The stages the agent asks for: generate, the beam's directions and optimize calls, and the repair a
# failed verdict calls for (prompt.repair_stage). Each has its prompt template.
STAGES = {"generate": "g", "directions": "d", "optimize": "o", "repair_build": "r", "repair_correctness": "r"}


def test_the_beam3_replay_file_fits_beam_2_3_over_two_rounds():
    lines = REPLAY.read_text(encoding="utf-8").splitlines()
    about = json.loads(lines[0])
    assert set(about) == {"about"} and "hand-written" in about["about"].lower()
    assert "not the output of any model" in about["about"] and SEARCH in about["about"]
    entries = [json.loads(line) for line in lines[1:]]
    assert {e["task"] for e in entries} == set(TASKS)
    assert all("hand-written" in e["model"] and "not a model's output" in e["model"] for e in entries)
    templates = REPO / "src" / "cutegen" / "templates"
    assert all((templates / f"{stage}.md.j2").is_file() for stage in STAGES)

    policy = search_policy(SEARCH)
    parents = [1] + [policy.width] * (ROUNDS - 1)  # kernels kept going into each round: the generation, then W
    # The order the agent asks in: per round a directions call per kept kernel, then K proposals from each,
    # side by side; a failed proposal's repair after the round's proposals (one repair each at most).
    pattern = "g" + "".join(f"d{{{p}}}o{{{p * policy.proposals}}}r{{0,{p * policy.proposals * REPAIRS}}}"
                            for p in parents)
    provider = ReplayProvider(REPLAY)  # the provider reads the file as the run will
    repairs = 0
    for task in TASKS:
        mine = [e for e in entries if e["task"] == task]
        assert [e["stage"] for e in provider.by_task[task]] == [e["stage"] for e in mine]
        assert {e["stage"] for e in mine} <= set(STAGES)
        shape = "".join(STAGES[e["stage"]] for e in mine)
        assert re.fullmatch(pattern, shape), (task, shape, pattern)
        assert shape.count("o") == policy.proposals * sum(parents) == 9
        repairs += shape.count("r")
        sources = set()
        for e in mine:
            if e["stage"] == "directions":  # K different directions, no code
                assert len(parse_directions(e["text"], policy.proposals)) == policy.proposals
                assert "```" not in e["text"]
            else:  # a module and its one-line idea (the idea memory's)
                assert re.search(r"^Idea: \S", e["text"], re.M), e["text"][:80]
                sources.add(extract_candidate(e["text"]).sha256)
        assert len(sources) == len(mine) - shape.count("d")  # every module a different one
    assert 1 <= repairs <= 2  # the deliberately failing proposals are few
