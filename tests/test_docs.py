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
    """(first cell, rest of the row) of every table row."""
    return [(line.split("|")[1], "|".join(line.split("|")[2:])) for line in text.splitlines()
            if line.startswith("| ") and line.count("|") >= 3]


def _cell_files(first: str) -> list[str]:
    """The files a row's first cell names, as paths under hintkv/: `server/limits.py`, `body.py` ->
    server/limits.py, server/body.py (a bare name lives in the folder of the cell's first path of
    its kind, `.py` or `.cpp`; with no path in the cell, at the top: `cli.py`, `__main__.py`)."""
    names = re.findall(r"`([\w/]+\.(?:py|cpp))`", first)

    def folder(ext: str) -> str:
        return next((n.rpartition("/")[0] + "/" for n in names if "/" in n and n.endswith(ext)), "")
    return [n if "/" in n else folder(n[n.rindex("."):]) + n for n in names]


def _folder_rows(text: str, folder: str) -> list[str]:
    """The descriptions of the rows whose first cell is `folder` itself (`server/`) or a family in it
    (`bench/swarm*.py`): rows that list that folder's modules."""
    out = []
    for first, rest in _rows(text):
        for p in re.findall(r"`([\w/]+/|[\w/]+\*\.py)`", first):
            if (p if p.endswith("/") else p.rpartition("/")[0] + "/") == folder:
                out.append(rest)
    return out


def _named(stem: str) -> str:
    """A module's stem in backticks, alone or before an attribute (`ranks.RankBoard`); `sam_dist`
    may be written `sam-dist` (its policy name)."""
    return "`" + re.escape(stem).replace("_", "[_-]") + r"(?:\.[\w.]*)?`"


def named_in(rel: str, text: str) -> bool:
    """Whether structure.md's `text` names the module `rel`, by one of three forms (a plain word, or
    a name in a sibling module's row, never counts):
    - its path, as a file: `server/body.py`, `cache/block_runs.BlockRuns`, `config.py`;
    - its file name in a row's first cell beside a sibling's path: `server/limits.py`, `body.py`;
    - its stem in backticks in the row of its folder (`server/`) or of a family in it (`bench/swarm*.py`)."""
    folder, _, name = rel.rpartition("/")
    if folder and re.search(r"(?<![\w/.])" + re.escape(rel[:-3]) + r"(?:\.py\b|\.[A-Za-z_]|`)", text):
        return True
    if re.search(r"(?<![\w/.])" + re.escape(rel) + r"\b", text):
        return True
    if any(rel in _cell_files(first) for first, _ in _rows(text)):
        return True
    return any(re.search(_named(name[:-3]), row) for row in _folder_rows(text, folder + "/" if folder else ""))


def test_structure_names_every_module():
    text = STRUCTURE.read_text()
    missing = [rel for rel in _modules() if not named_in(rel, text)]
    assert not missing, f"docs/structure.md does not name: {missing}"


def gone_names(text: str, package: Path = PACKAGE, root: Path = ROOT) -> list[str]:
    """Files and folders structure.md's `text` names that do not exist: every path in backticks
    (under hintkv/ or the repository), every file a row's first cell names (bare ones in their
    cell's folder, `config.py` at the top of hintkv/), and every family (`bench/swarm*.py`)."""
    cited = set(re.findall(r"`((?:[a-z_]+/)+[a-z_0-9]+\.(?:py|cpp))`", text))
    gone = [p for p in sorted(cited) if not (package / p).exists() and not (root / p).exists()]
    gone += [p for first, _ in _rows(text) for p in _cell_files(first)
             if p not in cited and not (package / p).exists()]
    folders = set(re.findall(r"`((?:[a-z_]+/)+)`", text))
    gone += [f for f in sorted(folders) if not (package / f).is_dir() and not (root / f).is_dir()]
    families = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]*\*\.py)`", text))
    gone += [f for f in sorted(families) if not list(package.glob(f))]
    return gone


def test_structure_names_no_module_that_is_gone():
    gone = gone_names(STRUCTURE.read_text())
    assert not gone, f"docs/structure.md names files or folders that do not exist: {gone}"


def test_the_rule_catches_a_missing_and_a_listed_module():
    text = ("| `server/` | the app, SSE `streaming` |\n| `server/limits.py`, `body.py` | limits |\n"
            "| `bench/swarm*.py` | `swarm_live.py` (one run) |\n| `cache/policies/` | `sam-dist` |\n"
            "| `tiers/` | `ranks.RankBoard` |\n| `cache/block_pool.py` | in a `cache/block_runs.BlockRuns` |\n"
            "| `cli.py`, `__main__.py` | the command |\n"
            "| `engine/admission_swap.py` | checked in `batching.make_room` |\n"
            "| `models/linear.py` | <= 12 rows `gemv_cpu`, auto (`cpu_choice.py`) |\n"
            "| `models/` | the model shape (`config`) |\n"
            "Serving builds the engine from a config; the registry of policies.\n")
    for named in ("server/body.py", "server/limits.py", "server/streaming.py", "bench/swarm_live.py",
                  "cache/policies/sam_dist.py", "tiers/ranks.py", "cache/block_runs.py", "cache/block_pool.py",
                  "cli.py", "__main__.py", "models/config.py"):
        assert named_in(named, text), named
    for missing in ("server/app.py", "server/hints.py", "bench/engine.py", "cache/sam_dist.py", "tiers/rank.py",
                    "cache/block.py", "config.py", "registry.py", "engine/batching.py", "models/cpu_choice.py",
                    "models/gemv_cpu.py"):
        assert not named_in(missing, text), missing


def test_a_named_file_that_is_gone_is_caught(tmp_path):
    package = tmp_path / "hintkv"
    (package / "server").mkdir(parents=True)
    for f in ("config.py", "server/limits.py", "bench_swarm.py"):
        (package / f).write_text("")
    text = ("| `config.py`, `cli.py` | x |\n| `server/limits.py`, `body.py` | y |\n| `server/` | z |\n"
            "| `bench/swarm*.py` | w |\n| `models/int8.py` | (`models/csrc/int8_cpu.cpp`) |\n")
    assert set(gone_names(text, package, tmp_path)) == {
        "cli.py", "server/body.py", "bench/swarm*.py", "models/int8.py", "models/csrc/int8_cpu.cpp"}


def _bench_docs() -> list[Path]:
    return sorted(BENCH_DOCS.glob("*.md"))


# A benchmark doc holds its Current state only; a session's new sections go at the end of
# history/<bench>.md. These docs still hold sixteenth-session sections written after their Current
# state before that rule; the lead moves them into history/ and empties this set.
AWAITING_MOVE: set[str] = set()


def _current_state(lines: list[str]) -> list[str]:
    start = lines.index("## Current state")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_each_benchmark_doc_holds_only_its_current_state_and_links_its_history():
    for doc in _bench_docs():
        lines = doc.read_text().splitlines()
        heads = [line for line in lines if line.startswith("## ")]
        assert heads and heads[0] == "## Current state", f"{doc.name}: first section is {heads[:1]}"
        assert len(heads) == 1 or doc.name in AWAITING_MOVE, (
            f"{doc.name}: new sections go at the end of history/{doc.name}, not after the Current state: {heads[1:]}")
        assert len(_current_state(lines)) <= CURRENT_STATE_MAX_LINES, doc.name
        history = BENCH_DOCS / "history" / doc.name
        assert history.exists(), f"{doc.name} has no history/{doc.name}"
        assert f"](history/{doc.name})" in doc.read_text(), f"{doc.name} does not link its history"


NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?!(?!x\b)\w)")


def numbers(text: str) -> set[str]:
    """The figures in `text`, thousands separators dropped (`1,601` -> `1601`); digits inside a word
    (`x3`, `b8`, a commit `3a5ef9e`) are no figure; a ratio's `x` is not part of it (`1.32x`)."""
    return {n.replace(",", "").rstrip(".") for n in NUMBER.findall(text)}


# Figures of a Current state that no source holds, each with the reason.
UNSOURCED: dict[tuple[str, str], str] = {}


def _sources(doc: Path) -> tuple[list[str], list[str]]:
    """`doc`'s Current state, and the lines its figures come from: history/<doc>.md, history/reruns.md,
    the history of every benchmark it links, and its own sections after the Current state."""
    lines = doc.read_text().splitlines()
    state = _current_state(lines)
    start = lines.index("## Current state")
    linked = {Path(t).name for t in re.findall(r"\]\(([\w/]+\.md)\)", "\n".join(state))}
    src = []
    for name in sorted({doc.name, "reruns.md", *linked}):
        if (BENCH_DOCS / "history" / name).exists():
            src += (BENCH_DOCS / "history" / name).read_text().splitlines()
    return state, src + lines[start + len(state):]


def unsourced_figures(doc: Path) -> list[str]:
    """The figures of `doc`'s Current state that none of its sources holds: a figure copied wrongly."""
    state, src = _sources(doc)
    held = numbers("\n".join(src))
    return sorted(n for n in numbers("\n".join(state)) - held if (doc.name, n) not in UNSOURCED)


# Figures of a Current state table row that no source line holds beside another figure of the row.
UNPAIRED = {
    ("swarm.md", "2.34"): "the offline replay's hit ratio (history/swarm.md's offline tables) beside the live 1.93",
    ("engine.md", "2.35"): "the fifteenth session's spec_decode run (history/spec_decode.md) beside the tenth's 2.82x",
}


def unpaired_figures(doc: Path) -> list[str]:
    """The figures of `doc`'s Current state table rows that no source holds within a line of another
    figure of the same row (a goal's target, after <= or >=, aside): a row's figure copied from the
    wrong row or mistyped into a figure found elsewhere in the history (0.901 -> 0.419)."""
    state, src = _sources(doc)
    near = [numbers(" ".join(src[max(0, i - 1):i + 2])) for i in range(len(src))]
    out = []
    for row in (line for line in state if line.startswith("| ")):
        row_figures = {n for n in numbers(re.sub(r"[<>]=?\s*[\d.,]+", " ", row))
                       if not re.fullmatch(r"\d", n) and (doc.name, n) not in UNPAIRED}
        for n in sorted(row_figures) if len(row_figures) > 1 else ():
            if not any(n in u and (row_figures - {n}) & u for u in near):
                out.append(n)
    return out


def test_each_current_state_figure_is_in_its_history():
    missing = {doc.name: m for doc in _bench_docs() if (m := unsourced_figures(doc))}
    assert not missing, f"Current state figures no history holds: {missing}"
    unpaired = {doc.name: m for doc in _bench_docs() if (m := unpaired_figures(doc))}
    assert not unpaired, f"Current state table figures no source line holds with the rest of their row: {unpaired}"


def _links(path: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
            if "://" not in t]


def test_the_benchmark_docs_links_resolve():
    docs = [ROOT / "docs" / "benchmarks.md", *_bench_docs(), *sorted((BENCH_DOCS / "history").glob("*.md"))]
    broken = [f"{d.relative_to(ROOT)} -> {t}" for d in docs for t in _links(d)
              if not (d.parent / t).exists()]
    assert not broken, broken


_UNITS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")
_TEENS = ("tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
          "eighteenth", "nineteenth")
ORDINALS = (*_UNITS, *_TEENS, "twentieth", *(f"twenty-{u}" for u in _UNITS), "thirtieth")
CITATION = re.compile(r"docs/benchmarks(?:/[\w/]+)?\.md")
WINDOW = 80


def _around(text: str, matches: list[re.Match]) -> list[tuple[re.Match, str, str]]:
    """Each match with the text before and after it: WINDOW characters, cut at its neighbours; what
    follows a new parenthesis or table cell after it is another statement, with its own source."""
    ends = [0, *(m.end() for m in matches)]
    starts = [*(m.start() for m in matches), len(text)]
    return [(m, text[max(ends[i], m.start() - WINDOW):m.start()],
             re.split(r"[(|]", text[m.end():min(starts[i + 1], m.end() + WINDOW)])[0])
            for i, m in enumerate(matches)]


def _citations() -> list[tuple[str, str, str, str]]:
    """(source, cited file, the text before it, the text after it) for every `docs/benchmarks...md` a
    docstring, help text or doc cites, and every link a Current state gives as its source."""
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    out = []
    for src in sources:
        text = " ".join(src.read_text().split())
        out += [(src.relative_to(ROOT).as_posix(), m.group(0), before, after)
                for m, before, after in _around(text, list(CITATION.finditer(text)))]
    for doc in _bench_docs():
        state = " ".join(" ".join(_current_state(doc.read_text().splitlines())).split())
        for m, before, after in _around(state, list(re.finditer(r"\[[^\]]*\]\(([\w/]+\.md)\)", state))):
            cited = (doc.parent / m.group(1)).resolve().relative_to(ROOT).as_posix()
            out.append((doc.relative_to(ROOT).as_posix(), cited, before, after))
    return out


_ORDINAL = "|".join(sorted(ORDINALS, key=len, reverse=True))


def stale_citation(cited: str, after: str, root: Path = ROOT, before: str = "", figures: bool = True) -> str | None:
    """Why a citation is stale, or None: the cited file is gone; the session (`..., tenth session`,
    `'s eleventh-session table`) or the quoted section (`"W8A8 prefill"`) it names is not in that
    file; or a figure written within WINDOW characters of the citation is not in that file."""
    path = root / cited
    if not path.exists():
        return "no such file"
    text = path.read_text()
    heads = " ".join(line.lower() for line in text.splitlines() if line.startswith("#"))
    m = re.match(rf"""[\s,'"]*(?:s\s+)?({_ORDINAL})[ -]session""", after, re.I)
    if m and f"{m.group(1).lower()} session" not in heads:
        return f"no section of the {m.group(1)} session"
    q = re.match(r"['s]*\s*,?\s*(?:[\w-]+ )?\"([^\"]+)\"", after)
    plain = " ".join(re.sub(r"[*`]", "", text).split()).lower()
    if q and " ".join(re.sub(r"[*`]", "", q.group(1)).split()).lower() not in plain:
        return f'no "{q.group(1)}"'
    if not figures:
        return None
    lacking = sorted(n for n in numbers(before + " " + after) if not holds(numbers(text), n))
    return f"no {lacking}" if lacking else None


def holds(held: set[str], figure: str) -> bool:
    """Whether `held` has `figure`, as written or rounded to its decimals (`0.82` cites `0.824`)."""
    if figure in held:
        return True
    decimals = len(figure.partition(".")[2])
    return any(h.count(".") <= 1 and len(h.partition(".")[2]) > decimals
               and round(float(h), decimals) == float(figure) for h in held if h[:1] == figure[:1])


def test_cited_benchmark_docs_hold_what_is_cited():
    # history/ is the record of what each session wrote then: its own figures are not checked again
    stale = [(src, cited, why) for src, cited, before, after in _citations()
             if (why := stale_citation(cited, after, before="" if "/history/" in src else before,
                                       figures="/history/" not in src))]
    assert not stale, stale


def test_a_citation_of_a_session_the_file_lacks_is_stale(tmp_path):
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks.md").write_text("| sim | fifteenth session: -21.1% |\n")
    (tmp_path / "docs" / "benchmarks" / "sim.md").write_text(
        "## Fifteenth session, sched\n**srpt** wins: 1.23x\n## Twenty-third session\n")
    assert stale_citation("docs/benchmarks.md", ", fifteenth session): 10 tasks", tmp_path)
    assert stale_citation("docs/benchmarks/sim.md", ", fifteenth session): 10 tasks", tmp_path) == "no ['10']"
    assert stale_citation("docs/benchmarks/sim.md", ", fifteenth session)", tmp_path) is None
    assert stale_citation("docs/benchmarks/sim.md", "'s twenty-third-session table", tmp_path) is None
    assert stale_citation("docs/benchmarks/sim.md", "'s twenty-fourth-session table", tmp_path)
    assert stale_citation("docs/benchmarks/sim.md", "'s eighteenth-session table", tmp_path)
    assert stale_citation("docs/benchmarks/sim.md", ' "srpt wins"', tmp_path) is None
    assert stale_citation("docs/benchmarks/sim.md", ' "srpt loses"', tmp_path)
    assert stale_citation("docs/benchmarks/sim.md", ")", tmp_path, before="prefill 1.23x (") is None
    assert stale_citation("docs/benchmarks/sim.md", ")", tmp_path, before="prefill 1.32x (") == "no ['1.32']"
    assert stale_citation("docs/benchmarks/gone.md", "", tmp_path)


def test_ordinals_run_past_the_sessions_so_far():
    assert ORDINALS[16:] [:4] == ("seventeenth", "eighteenth", "nineteenth", "twentieth")
    assert ORDINALS[-2:] == ("twenty-ninth", "thirtieth") and len(ORDINALS) == 30
