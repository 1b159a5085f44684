"""W8A8 calibration: per-input-channel activation maxima on a fixed text set, and SmoothQuant scales.

The calibration texts ship with the repository and are distinct from the accuracy benchmark's
evaluation texts (`bench/accuracy.py`): prose, Python, a shell session and a tool-call message,
590 SmolLM2 tokens. `calibrate` runs them in float through the model (before any kernel is
quantized) and records, for every `Linear`, the largest |x| each input channel saw;
`int8.smoothing(absmax, weight)` turns that into SmoothQuant's s = max|x|^a / max|W|^(1-a), a = 0.5
(`int8.ALPHA`; measured on SmolLM2, two-level activations, KL/token to float32: no smoothing 0.0031, a = 0.25
0.0031, a = 0.5 0.0024).
"""

from __future__ import annotations

import torch
from torch import nn

from hintkv.models.linear import Linear
from hintkv.models.one_sequence import OneSequence

CALIBRATION_TEXTS = (
    ("A compiler translates a program written in one language into another, usually lower-level, "
     "language. Early compilers were written by hand in assembly; later ones were built with parser "
     "generators and intermediate representations that let one optimiser serve many source languages "
     "and many machines. Modern toolchains split the work into a front end that checks types and "
     "builds a syntax tree, a middle end that rewrites the program into faster equivalent forms, and "
     "a back end that chooses instructions and allocates registers for the target processor."),
    ("import json\nfrom pathlib import Path\n\n\ndef load_config(path: str) -> dict:\n"
     "    \"\"\"Read a JSON config file and fill in defaults.\"\"\"\n    data = json.loads(Path(path).read_text())\n"
     "    data.setdefault(\"workers\", 4)\n    data.setdefault(\"timeout\", 30.0)\n"
     "    if data[\"workers\"] < 1:\n        raise ValueError(\"workers must be at least 1\")\n    return data\n\n\n"
     "class Cache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n        self.items = {}\n\n"
     "    def get(self, key, default=None):\n        return self.items.get(key, default)\n"),
    ("$ git status\nOn branch main\nChanges not staged for commit:\n  modified:   src/server/app.py\n"
     "  modified:   tests/test_app.py\n$ python -m pytest tests/test_app.py -q\n..F.\n"
     "FAILED tests/test_app.py::test_timeout - AssertionError: expected 504, got 500\n"
     "1 failed, 3 passed in 0.42s\n$ grep -n \"timeout\" src/server/app.py\n"
     "41:    timeout = request.headers.get(\"X-Timeout\")\n57:        raise RuntimeError(\"upstream timeout\")\n"),
    ("{\"role\": \"assistant\", \"content\": \"I will open the file to see how the timeout is handled.\", "
     "\"tool_calls\": [{\"id\": \"call_7\", \"type\": \"function\", \"function\": {\"name\": \"open_file\", "
     "\"arguments\": \"{\\\"path\\\": \\\"src/server/app.py\\\", \\\"line\\\": 50}\"}}]}\n"
     "The handler raises a plain RuntimeError, so the framework answers 500. Returning a response "
     "with status 504 and a short JSON error body fixes the failing test without changing the others."),
    ("Rivers shape the land they cross. Over thousands of years a river carves its valley, carries "
     "sand and silt downstream, and builds deltas where it meets the sea. Floods spread fertile soil "
     "over the plains, which is why many of the oldest farming towns grew up along the Nile, the "
     "Tigris and the Euphrates, the Indus and the Yellow River."),
)


def calibration_token_lists(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in CALIBRATION_TEXTS]


@torch.inference_mode()
def calibrate(model: nn.Module, token_lists: list[list[int]]) -> dict[str, torch.Tensor]:
    """{Linear's module name: max |x| per input channel [K]} over the texts, run as the model is now."""
    absmax: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_mod: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
            absmax[name] = torch.maximum(absmax[name], x) if name in absmax else x
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, Linear)]
    try:
        for ids in token_lists:
            OneSequence(model, len(ids)).hidden(ids)
    finally:
        for h in handles:
            h.remove()
    return absmax
