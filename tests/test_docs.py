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


ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
            "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth")
CITATION = re.compile(r"docs/benchmarks(?:/[\w/]+)?\.md")


def _citations() -> list[tuple[str, str, str]]:
    """(source, cited file, the text right after it) for every `docs/benchmarks...md` a docstring,
    help text or doc cites."""
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    out = []
    for src in sources:
        text = " ".join(src.read_text().split())
        out += [(src.relative_to(ROOT).as_posix(), m.group(0), text[m.end():m.end() + 80])
                for m in CITATION.finditer(text)]
    return out


def stale_citation(cited: str, after: str, root: Path = ROOT) -> str | None:
    """Why a citation is stale, or None: the cited file is gone, or the session (`..., tenth session`)
    or the quoted section (`"W8A8 prefill"`) it names is not in that file."""
    path = root / cited
    if not path.exists():
        return "no such file"
    text = path.read_text()
    heads = " ".join(line.lower() for line in text.splitlines() if line.startswith("#"))
    m = re.match(r"""[\s,'"]*(\w+) session""", after, re.I)
    if m and m.group(1).lower() in ORDINALS and f"{m.group(1).lower()} session" not in heads:
        return f"no section of the {m.group(1)} session"
    q = re.match(r"['s]*\s*,?\s*(?:[\w-]+ )?\"([^\"]+)\"", after)
    plain = " ".join(re.sub(r"[*`]", "", text).split()).lower()
    if q and " ".join(q.group(1).split()).lower() not in plain:
        return f'no "{q.group(1)}"'
    return None


def test_cited_benchmark_docs_hold_what_is_cited():
    stale = [(src, cited, why) for src, cited, after in _citations()
             if (why := stale_citation(cited, after))]
    assert not stale, stale


def test_a_citation_of_a_session_the_file_lacks_is_stale(tmp_path):
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks.md").write_text("| sim | fifteenth session: -21.1% |\n")
    (tmp_path / "docs" / "benchmarks" / "sim.md").write_text("## Fifteenth session, sched\n**srpt** wins\n")
    assert stale_citation("docs/benchmarks.md", ", fifteenth session): 10 tasks", tmp_path)
    assert stale_citation("docs/benchmarks/sim.md", ", fifteenth session): 10 tasks", tmp_path) is None
    assert stale_citation("docs/benchmarks/sim.md", ' "srpt wins"', tmp_path) is None
    assert stale_citation("docs/benchmarks/sim.md", ' "srpt loses"', tmp_path)
    assert stale_citation("docs/benchmarks/gone.md", "", tmp_path)
