"""The pitfalls of the knowledge pack stay true: each snippet in tests/pitfalls/ fails to build with
nvcc for sm_90a (through the project's runtime, headers and flags) and the distilled error holds the
message that pitfalls.md quotes (its `// Expect:` line; test_knowledge.py checks the two lists agree);
a snippet whose exact inputs gave that error before is not compiled again (tests/compile_record.py).
The code the cuda backend's prompts show compiles: the plain-CUDA pack's snippets (which its excerpts
are slices of) and the contract's example. Marked nvcc (compile-only, no GPU); skipped when nvcc or
the CUTLASS headers are missing."""

from __future__ import annotations

import hashlib
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cutegen.config import RuntimeConfig
from cutegen.errors import BuildError
from cutegen.runtime import build_library, check_compiles, check_key, distill, library_key

from compile_record import compiled_before, remember
from helpers import needs_nvcc

SNIPPETS = sorted((Path(__file__).resolve().parent / "pitfalls").glob("*.cu"))


def _build(path: Path, config: RuntimeConfig) -> tuple[str, float, str | None]:
    started = time.perf_counter()
    try:
        # The device code first (half a build); a pitfall that only the host compiler or the link
        # reports (an anonymous namespace's launcher, a device function called from the host) needs the rest.
        check_compiles(path.read_text(), config)
        build_library(path.read_text(), config)
    except BuildError as err:
        return path.name, time.perf_counter() - started, err.distilled
    return path.name, time.perf_counter() - started, None


def _record_keys(path: Path, config: RuntimeConfig, expected: str) -> list[str]:
    """What a snippet's outcome depends on (tests/compile_record.py): the keys of its device check and
    of its build, the code that distills nvcc's errors, and the error quoted. Empty for a snippet the
    pre-nvcc check names (it costs nothing, so it always runs)."""
    source = path.read_text()
    try:
        distiller = hashlib.sha256(Path(distill.__file__).read_bytes()).hexdigest()
        return [f"{check_key(source, config)} {library_key(source, config)} {distiller} expect: {expected}"]
    except BuildError:
        return []


@pytest.mark.nvcc
@needs_nvcc
def test_every_pitfall_snippet_gives_the_quoted_error(tmp_path):
    config = RuntimeConfig(cache_dir=tmp_path / "cache", arch="sm_90a")
    expected = {p.name: re.search(r"^// Expect: (.+)$", p.read_text(), re.M).group(1) for p in SNIPPETS}
    keys = {p.name: _record_keys(p, config, expected[p.name]) for p in SNIPPETS}
    todo = [p for p in SNIPPETS if not compiled_before(keys[p.name])]
    print(f"{len(SNIPPETS) - len(todo)} snippets gave their quoted error with these exact inputs before")
    with ThreadPoolExecutor(max_workers=2) as pool:  # nvcc is single-threaded; CI machines have 2 cores
        results = list(pool.map(lambda p: _build(p, config), todo))
    wrong = []
    for name, seconds, distilled in results:
        print(f"{name}: {seconds:.1f} s")
        if distilled is None:
            wrong.append(f"{name} built without an error")
        elif expected[name] not in distilled:
            wrong.append(f"{name}: expected {expected[name]!r} in:\n{distilled}")
        else:
            remember(name, keys[name])
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.nvcc
@needs_nvcc
def test_the_cuda_prompts_code_compiles(tmp_path):
    import types

    from cutegen.evaluate.checks_static import run_static_checks
    from cutegen.extract import extract_candidate
    from cutegen.prompt import render_template
    from cutegen.runtime import find_kernels

    config = RuntimeConfig(cache_dir=tmp_path / "cache", arch="sm_90a")
    example = extract_candidate(render_template("contract.md.j2", backend="cuda")).source
    assert run_static_checks(example, backend="cuda") == ()
    module = types.ModuleType("contract_example")
    exec(compile(example, "contract_example", "exec"), module.__dict__)  # noqa: S102 - our own template
    (kernel,) = find_kernels(module)
    snippets = (Path(__file__).resolve().parent / "knowledge_cuda" / "snippets.cu").read_text()
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = list(pool.map(lambda build: build(), (lambda: kernel.build(config),
                                                       lambda: build_library(snippets, config))))
    assert all(result.library_path.is_file() and result.arch == "sm_90a" for result in built)
