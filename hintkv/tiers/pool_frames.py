"""The pool tier's wire format: a block's pool key and its frame.

Each block is stored as `disk_format` header (key, layout fingerprint, length, and a
BLAKE2b MAC of the payload keyed by `secret`, which the instances of one deployment share:
`HINTKV_POOL_SECRET`; empty, it is a plain checksum) + payload, and every read checks all of
it: a blob from another model or layout, a torn write, a key racing its removal, all turn
into a miss (recompute), never into wrong KV.

A key is the tier's prefix and the block's chained hash in hex (content keys: two instances that
compute the same block write the same key).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from hintkv.tiers.disk_format import (
    HEADER_SIZE,
    BadBlockFile,
    block_mac,
    decode_header,
    encode_header,
)

log = logging.getLogger("hintkv.tiers.pool")


class PoolFrames:
    """Mixin of `PoolTier`: reads its `_key_head`, `frame_nbytes`, `layout`, `_fingerprint`,
    `secret` (and counts a bad frame in `_stats` under `_lock`)."""

    def pool_key(self, key: bytes) -> str:
        return self._key_head + key.hex()

    def pool_keys(self, keys: Iterable[bytes]) -> list[str]:
        """`pool_key` of each, made in C (keep-alive sends every live block once a second)."""
        return list(map(self._key_head.__add__, map(bytes.hex, keys)))

    def _frames(self, items: list[tuple[bytes, torch.Tensor]]) -> list[torch.Tensor]:
        """Each block's frame (header + payload), all in one buffer: one copy of the payloads,
        then a MAC and a header per block (a put batch is a prompt's thousands of blocks)."""
        blobs = torch.empty((len(items), self.frame_nbytes), dtype=torch.uint8)
        payloads = torch.stack([src.detach().reshape(-1) for _, src in items])
        blobs[:, HEADER_SIZE:] = payloads.cpu().view(torch.uint8)
        bodies = blobs[:, HEADER_SIZE:].numpy()
        fp, nbytes, secret = self._fingerprint, self.layout.nbytes, self.secret
        headers = b"".join(encode_header(key, fp, nbytes, block_mac(secret, key, fp, body))
                           for (key, _), body in zip(items, bodies))
        blobs[:, :HEADER_SIZE] = torch.frombuffer(bytearray(headers), dtype=torch.uint8).view(
            len(items), HEADER_SIZE)
        return list(blobs.unbind(0))

    def _unframe(self, key: bytes, blob: torch.Tensor, dst: torch.Tensor) -> bool:
        try:
            _, mac = decode_header(blob[:HEADER_SIZE].numpy().tobytes(), self._fingerprint,
                                   self.layout.nbytes, key)
            if block_mac(self.secret, key, self._fingerprint, blob[HEADER_SIZE:].numpy()) != mac:
                raise BadBlockFile("payload MAC mismatch")
        except BadBlockFile as e:
            log.warning("pool tier: dropping block %s: %s", key.hex(), e)
            with self._lock:
                self._stats.num_corrupt += 1
            return False
        payload = blob[HEADER_SIZE:].view(self.layout.dtype).view(self.layout.shape)
        dst.copy_(payload)
        return True
