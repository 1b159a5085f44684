"""The docs name what the code holds: docs/structure.md lists every module of `hintkv/` and
no module that is gone; each docs/benchmarks/<bench>.md opens with a short current state whose
history lies beside it; code and docs cite benchmark sections in files that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hintkv"
STRUCTURE = ROOT / "docs" / "structure.md"
BENCH_DOCS = ROOT / "docs" / "benchmarks"
CURRENT_STATE_MAX_LINES = 60


def _modules() -> list[str]:
    """Every module of the package, as a path relative to hintkv/ (`server/body.py`)."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                  if p.name != "__init__.py")


def _rows(text: str) -> list[tuple[str, str]]:
    """(first cell, whole row) of every table row."""
    return [(line.split("|")[1], line) for line in text.splitlines()
            if line.startswith("| ") and line.count("|") >= 3]


def _named(stem: str) -> str:
    """A module's stem in backticks, alone or before an attribute (`ranks.RankBoard`); `sam_dist`
    may be written `sam-dist` (its policy name)."""
    return "`" + re.escape(stem).replace("_", "[_-]") + r"(?:\.[\w.]*)?`"


def named_in(rel: str, text: str) -> bool:
    """Whether structure.md's `text` names the module `rel`: by its path anywhere (`server/body.py`,
    or `cache/block_runs.BlockRuns`), or in backticks in the row of its folder: the first cell
    names the folder (`server/`), a family in it (`bench/swarm*.py`) or a sibling module
    (`server/limits.py`, `body.py`)."""
    if re.search(re.escape(rel[:-3]) + r"(?![\w])", text):
        return True
    folder, _, name = rel.rpartition("/")
    folder = folder + "/" if folder else ""
    stem = name[:-3]
    for first, row in _rows(text):
        paths = re.findall(r"`([\w/]+(?:/|\*?\.py))`", first)
        if any(p == folder or p.rpartition("/")[0] + "/" == folder for p in paths if "/" in p):
            if re.search(_named(stem), row):
                return True
    return False


def test_structure_names_every_module():
    text = STRUCTURE.read_text()
    missing = [rel for rel in _modules() if not named_in(rel, text)]
    assert not missing, f"docs/structure.md does not name: {missing}"


def test_structure_names_no_module_that_is_gone():
    text = STRUCTURE.read_text()
    cited = set(re.findall(r"`((?:[a-z_]+/)+[a-z_0-9]+\.(?:py|cpp))`", text))
    gone = [p for p in sorted(cited)
            if not (PACKAGE / p).exists() and not (PACKAGE / "models" / p).exists()
            and not (ROOT / p).exists()]
    assert not gone, f"docs/structure.md names files that do not exist: {gone}"
    folders = set(re.findall(r"`((?:[a-z_]+/)+)`", text))
    gone = [f for f in sorted(folders) if not (PACKAGE / f).is_dir() and not (ROOT / f).is_dir()]
    assert not gone, f"docs/structure.md names folders that do not exist: {gone}"


def test_the_rule_catches_a_missing_and_a_listed_module():
    text = ("| `server/` | the app, SSE `streaming` |\n| `server/limits.py`, `body.py` | limits |\n"
            "| `bench/swarm*.py` | `swarm_live.py` (one run) |\n| `cache/policies/` | `sam-dist` |\n"
            "| `tiers/` | `ranks.RankBoard` |\n| `cache/block_pool.py` | in a `cache/block_runs.BlockRuns` |\n")
    for named in ("server/body.py", "server/streaming.py", "bench/swarm_live.py", "cache/policies/sam_dist.py",
                  "tiers/ranks.py", "cache/block_runs.py", "cache/block_pool.py"):
        assert named_in(named, text), named
    for missing in ("server/app.py", "server/hints.py", "bench/engine.py", "cache/sam_dist.py", "tiers/rank.py",
                    "cache/block.py"):
        assert not named_in(missing, text), missing


def _bench_docs() -> list[Path]:
    return sorted(BENCH_DOCS.glob("*.md"))


def _current_state(lines: list[str]) -> list[str]:
    start = lines.index("## Current state")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_each_benchmark_doc_opens_with_its_current_state_and_links_its_history():
    for doc in _bench_docs():
        lines = doc.read_text().splitlines()
        heads = [line for line in lines if line.startswith("## ")]
        assert heads and heads[0] == "## Current state", f"{doc.name}: first section is {heads[:1]}"
        assert len(_current_state(lines)) <= CURRENT_STATE_MAX_LINES, doc.name
        history = BENCH_DOCS / "history" / doc.name
        assert history.exists(), f"{doc.name} has no history/{doc.name}"
        assert f"](history/{doc.name})" in doc.read_text(), f"{doc.name} does not link its history"


def _links(path: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
            if "://" not in t]


def test_the_benchmark_docs_links_resolve():
    docs = [ROOT / "docs" / "benchmarks.md", *_bench_docs(), *sorted((BENCH_DOCS / "history").glob("*.md"))]
    broken = [f"{d.relative_to(ROOT)} -> {t}" for d in docs for t in _links(d)
              if not (d.parent / t).exists()]
    assert not broken, broken


def test_cited_benchmark_docs_exist():
    """A docstring or doc that cites `docs/benchmarks/<x>.md` (or the index) cites a file that exists."""
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    cited = {(src.relative_to(ROOT).as_posix(), m) for src in sources
             for m in re.findall(r"docs/benchmarks(?:/[\w/]+)?\.md", src.read_text())}
    gone = sorted(c for c in cited if not (ROOT / c[1]).exists())
    assert not gone, gone
