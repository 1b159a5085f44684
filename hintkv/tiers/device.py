"""Gather and scatter whole blocks between the device KV cache and tier payloads.

The model runner owns, per layer, one tensor `kv: [2, num_blocks, block_size, num_kv_heads,
head_dim]` (K and V). A block leaving the device is gathered across all layers into one payload
`[num_layers, 2, block_size, num_kv_heads, head_dim]` (`layout.BlockLayout.shape`); a block
coming back is scattered into its new block ids. On CUDA both are one indexed copy per layer for
the whole batch of blocks. On a CPU each copy is one piece of the blocks (a slice of consecutive ids,
else one indexed copy), of one K or V half of one layer, under `CPU_COPY_ELEMS` elements
(`_cpu_pieces`): PyTorch runs a copy that small on the calling thread, where a larger one opens an
OpenMP region whose barrier, on a loaded 2-core box, took a 2K-token SmolLM2 resume's scatter (94 MB)
from ~36 ms to 411-943 ms. In pieces: 39-42 ms (ids in one run), 48-63 ms (scattered) at load 4.8
(twenty-ninth session).
"""

from __future__ import annotations

import torch

from hintkv.tiers.layout import BlockLayout

CPU_COPY_ELEMS = 32768  # at::internal::GRAIN_SIZE: a copy of fewer elements runs without an OpenMP region


class DeviceBlockIO:
    def __init__(self, kv_caches: list[torch.Tensor]) -> None:
        if not kv_caches:
            raise ValueError("need at least one layer's KV cache")
        first = kv_caches[0]
        if first.dim() != 5 or first.shape[0] != 2:
            raise ValueError(f"a layer's KV cache must be [2, num_blocks, block_size, heads, "
                             f"head_dim], got {tuple(first.shape)}")
        for kv in kv_caches:
            if kv.shape != first.shape or kv.dtype != first.dtype or kv.device != first.device:
                raise ValueError("all layers' KV caches must share shape, dtype and device")
        self.kv_caches = kv_caches
        self.num_blocks = first.shape[1]
        self.device = first.device
        _, _, block_size, num_kv_heads, head_dim = first.shape
        self.layout = BlockLayout(len(kv_caches), block_size, num_kv_heads, head_dim, first.dtype)

    def read(self, block_ids: list[int], out: torch.Tensor) -> None:
        """Gather blocks `block_ids` into `out: [len(block_ids), *layout.shape]` (any device)."""
        self._check(block_ids, out)
        if self.device.type == "cpu":
            self._cpu_copy(block_ids, out, into_payload=True)
            return
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        for layer, kv in enumerate(self.kv_caches):
            # [2, n, ...] -> [n, 2, ...]: the payload keeps each block's K and V together
            out[:, layer].copy_(kv.index_select(1, idx).transpose(0, 1))

    def read_async(self, block_ids: list[int], out: torch.Tensor,
                   stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        """`read` on the copy `stream` when the cache is on CUDA: the gather waits for the
        compute stream's work queued so far (the KV being read is complete), copies into `out`
        (pinned host memory) without blocking the caller, and the compute stream waits for it
        before anything queued later (the forward that reuses these blocks) runs. Returns the
        event that marks `out` filled. Without CUDA or a stream: a plain `read`, returns None."""
        if stream is None or self.device.type != "cuda":
            self.read(block_ids, out)
            return None
        self._check(block_ids, out)
        compute = torch.cuda.current_stream(self.device)
        stream.wait_stream(compute)
        with torch.cuda.stream(stream):
            idx = torch.tensor(block_ids, dtype=torch.long).to(self.device, non_blocking=True)
            for layer, kv in enumerate(self.kv_caches):
                out[:, layer].copy_(kv.index_select(1, idx).transpose(0, 1), non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        compute.wait_event(done)  # the forward may overwrite these blocks only after the copy
        return done

    def write(self, block_ids: list[int], src: torch.Tensor) -> None:
        """Scatter `src: [len(block_ids), *layout.shape]` into blocks `block_ids` (distinct)."""
        self._check(block_ids, src)
        if len(set(block_ids)) != len(block_ids):
            raise ValueError("block ids of one write must be distinct")
        if self.device.type == "cpu" and src.device.type == "cpu":
            self._cpu_copy(block_ids, src, into_payload=False)
            return
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        src = src.to(self.device, non_blocking=True)
        for layer, kv in enumerate(self.kv_caches):
            kv.index_copy_(1, idx, src[:, layer].transpose(0, 1))

    def _cpu_copy(self, block_ids: list[int], payload: torch.Tensor, into_payload: bool) -> None:
        """`read` (into_payload) or `write` on a CPU cache, piece by piece (`_cpu_pieces`)."""
        for j, n, first, idx in _cpu_pieces(block_ids, self.kv_caches[0][0, 0].numel()):
            for layer, kv in enumerate(self.kv_caches):
                for half in (0, 1):
                    rows = payload[j:j + n, layer, half]
                    if into_payload:
                        rows.copy_(kv[half, first:first + n] if idx is None else kv[half].index_select(0, idx))
                    elif idx is None:
                        kv[half, first:first + n].copy_(rows)
                    else:
                        kv[half].index_copy_(0, idx, rows)

    def _check(self, block_ids: list[int], t: torch.Tensor) -> None:
        expected = (len(block_ids), *self.layout.shape)
        if tuple(t.shape) != expected or t.dtype != self.layout.dtype:
            raise ValueError(f"payload batch {tuple(t.shape)} {t.dtype}, expected {expected} "
                             f"{self.layout.dtype}")
        if block_ids and not all(0 <= b < self.num_blocks for b in block_ids):
            raise ValueError(f"block ids must be in [0, {self.num_blocks})")


def _cpu_pieces(block_ids: list[int], block_elems: int) -> list[tuple[int, int, int, torch.Tensor | None]]:
    """The payload rows in pieces of fewer than CPU_COPY_ELEMS elements per K or V half (at least one block):
    (first row, rows, first block id, None) where the piece's block ids are consecutive (a slice), else
    (first row, rows, -1, their ids) (one indexed copy): a bounded number of copies however scattered the ids."""
    most = max(1, (CPU_COPY_ELEMS - 1) // block_elems)
    out: list[tuple[int, int, int, torch.Tensor | None]] = []
    for j in range(0, len(block_ids), most):
        ids = block_ids[j:j + most]
        if all(b - a == 1 for a, b in zip(ids, ids[1:])):
            out.append((j, len(ids), ids[0], None))
        else:
            out.append((j, len(ids), -1, torch.tensor(ids, dtype=torch.long)))
    return out
