"""The accuracy benchmark's evaluation set and its bootstrap intervals (`bench/accuracy.py`)."""

from __future__ import annotations

import random

import torch

from hintkv.bench.accuracy import EVAL_TEXTS, FIXED_TEXTS, compare, compare_all, eval_texts
from hintkv.models.calibration import CALIBRATION_TEXTS
from hintkv.models.loader import load_model


def test_the_evaluation_set_ships_and_is_not_the_calibration_set():
    texts = eval_texts()
    assert len(texts) >= 25 and sum(len(t) for _, t in texts) > 30_000
    assert all(src and t and not t.startswith("\n") and "%%%% text:" not in t for src, t in texts)
    assert len({t for _, t in texts}) == len(texts)
    for _, t in texts:
        assert all(t[:60] not in cal and cal[:60] not in t for cal in CALIBRATION_TEXTS)
        assert all(t[:60] not in ev for ev in FIXED_TEXTS)


# a copied text's source (as its "%%%% text:" line names it) -> its copyright line in data/NOTICE
_COPYRIGHTS = {"python 3.11": "Copyright (c) 2001-2023 Python Software Foundation; All Rights Reserved",
               "httpx-": "Copyright © 2019, [Encode OSS Ltd]", "attrs-": "Copyright (c) 2015 Hynek Schlawack",
               "click-": "Copyright 2014 Pallets", "msgpack-": "Copyright (C) 2008-2011 INADA Naoki"}
_LICENCES = {"PSF license": "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2", "BSD-3-Clause license":
             "Redistribution and use in source and binary forms", "MIT license": "Permission is hereby granted",
             "Apache-2.0 license": "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION"}


def test_every_copied_text_has_its_notice_next_to_the_set():
    """The licences of the copied texts require their copyright notices (and licence texts) to travel
    with them: data/NOTICE, packaged with the set, has one for each source a text names."""
    notice = (EVAL_TEXTS.parent / "NOTICE").read_text(encoding="utf-8")
    copied = [src for src, _ in eval_texts() if "written for hintkv" not in src]
    assert copied
    for src in copied:
        assert [k for k in _COPYRIGHTS if src.startswith(k)], f"a copied text of unknown source: {src}"
        assert all(line in notice for k, line in _COPYRIGHTS.items() if src.startswith(k)), src
        licence = [name for name in _LICENCES if name in src]
        assert licence and all(_LICENCES[name] in notice for name in licence), src


def test_compare_all_runs_every_case_over_one_reference_pass_with_intervals():
    lm = load_model("dummy:tiny", torch.float32, "cpu")
    rng = random.Random(0)
    lists = [[rng.randrange(100, 5000) for _ in range(rng.randrange(6, 14))] for _ in range(10)]
    out = compare_all(lm.model, {"same": (lm.model, "auto", None), "int8": (lm.model, "int8", None),
                                 "steps": (lm.model, "int8", 3)}, lists)
    same, int8 = out["same"], out["int8"]
    assert same["top1_agreement"] == 1.0 and same["kl_per_token"] == 0.0
    assert same["top1_agreement_ci95"] == [1.0, 1.0] and same["kl_per_token_ci95"] == [0.0, 0.0]
    assert int8["tokens"] == sum(map(len, lists)) and int8["kl_per_token"] > 0
    for fig in out.values():
        for key in ("top1_agreement", "kl_per_token", "ppl_candidate", "ppl_reference"):
            lo, hi = fig[f"{key}_ci95"]
            assert lo <= fig[key] <= hi, (key, fig)
    lo, hi = int8["kl_per_token_ci95"]
    assert hi > lo  # texts differ, so resampling them moves the figure
    # one case alone gives the same figures (the shared reference pass changes nothing); < 8 texts: no interval
    alone = compare(lm.model, lm.model, lists, "int8")
    assert alone == int8
    assert "top1_agreement_ci95" not in compare(lm.model, lm.model, lists[:5], "int8")
