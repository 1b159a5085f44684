"""The on-disk format of one KV block: a fixed-size header, then the raw payload bytes.

    | magic "HKVB" | version u16 | key_len u16 | layout fingerprint 16B | payload_len u64 |
    | payload crc32 u32 | key, zero-padded to 64B | header crc32 u32 | payload ... |

The header names the block (key), what its bytes mean (layout fingerprint) and how many there
are, so a file is validated against what the reader expects before any byte is trusted; the
payload crc32 (zlib, ~2 GB/s here, faster than the disk) catches torn writes and bit rot.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"HKVB"
VERSION = 1
MAX_KEY_LEN = 64
_FIELDS = struct.Struct("<4sHH16sQI")
_CRC = struct.Struct("<I")
HEADER_SIZE = _FIELDS.size + MAX_KEY_LEN + _CRC.size


class BadBlockFile(ValueError):
    """The header does not describe the block the reader expects."""


def checksum(data) -> int:
    return zlib.crc32(data)


def encode_header(key: bytes, fingerprint: bytes, payload_len: int, payload_crc: int) -> bytes:
    if not 0 < len(key) <= MAX_KEY_LEN:
        raise ValueError(f"key length must be 1..{MAX_KEY_LEN}, got {len(key)}")
    head = _FIELDS.pack(MAGIC, VERSION, len(key), fingerprint, payload_len, payload_crc)
    head += key.ljust(MAX_KEY_LEN, b"\0")
    return head + _CRC.pack(checksum(head))


def decode_header(buf: bytes, fingerprint: bytes, payload_len: int,
                  key: bytes | None = None) -> tuple[bytes, int]:
    """Validate a header; return (key, payload crc). Raises BadBlockFile on any mismatch."""
    if len(buf) != HEADER_SIZE:
        raise BadBlockFile(f"truncated header ({len(buf)} of {HEADER_SIZE} bytes)")
    body, (crc,) = buf[:-_CRC.size], _CRC.unpack(buf[-_CRC.size:])
    if checksum(body) != crc:
        raise BadBlockFile("header checksum mismatch")
    magic, version, key_len, fp, length, payload_crc = _FIELDS.unpack(body[:_FIELDS.size])
    if magic != MAGIC or version != VERSION:
        raise BadBlockFile(f"not a v{VERSION} block file (magic {magic!r}, version {version})")
    if fp != fingerprint:
        raise BadBlockFile("written for another block layout")
    if length != payload_len:
        raise BadBlockFile(f"payload length {length}, expected {payload_len}")
    stored_key = body[_FIELDS.size:_FIELDS.size + key_len]
    if key is not None and stored_key != key:
        raise BadBlockFile("header names another key")
    return stored_key, payload_crc
