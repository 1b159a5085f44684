"""Trace files on disk (gzip or not) and the scale factors every loader applies."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Scale:
    """How a trace is shrunk to fit a machine: token lengths x `token_scale` (each at least one
    token), each agent's calls cut to its first `max_calls` (None: all). Times are left in trace
    seconds; drivers divide them by their time scale."""

    token_scale: float = 0.25
    max_calls: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.token_scale <= 1:
            raise ValueError(f"token_scale must be in (0, 1], got {self.token_scale}")
        if self.max_calls is not None and self.max_calls < 1:
            raise ValueError("max_calls must be >= 1")

    def tokens(self, n: float) -> int:
        return max(1, round(n * self.token_scale))


DEFAULT_SCALE = Scale()


def trace_files(folder: str | Path, suffixes: tuple[str, ...] = (".json",)) -> list[Path]:
    """Files in `folder` whose name ends in one of `suffixes` (optionally + .gz), sorted by name."""
    out = []
    for p in sorted(Path(folder).iterdir()):
        name = p.name.removesuffix(".gz")
        if p.is_file() and name.endswith(suffixes):
            out.append(p)
    if not out:
        raise FileNotFoundError(f"no trace files ({', '.join(suffixes)}[.gz]) in {folder}")
    return out


def read_json(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def trace_name(path: Path) -> str:
    name = path.name.removesuffix(".gz")
    return name.split(".")[0]
