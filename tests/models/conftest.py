"""Fixtures for model tests (helpers live in tiny_hf_checkpoints.py: a uniquely named module,
since several test folders have a conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_hf_checkpoints import VARIANTS, write_hf_checkpoint


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    out = {}
    for variant in VARIANTS:
        d = tmp_path_factory.mktemp(variant)
        out[variant] = (d, write_hf_checkpoint(d, variant))
    return out
