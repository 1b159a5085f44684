"""The on-disk format of one KV block: a fixed-size header, then the raw payload bytes.

    | magic "HKVB" | version u16 | key_len u16 | layout fingerprint 16B | payload_len u64 |
    | key, zero-padded to 64B | MAC 16B | header crc32 u32 | payload ... |

The header names the block (key), what its bytes mean (layout fingerprint) and how many there
are, so a file is validated against what the reader expects before any byte is trusted. The MAC
is a BLAKE2b keyed by this deployment's secret (`SECRET_FILE`, kept in the cache directory,
readable by the server's user only) over fingerprint, key and payload: it catches torn writes
and bit rot like a checksum would, and also a file someone else wrote or edited (a crc32 can be
recomputed by anyone; this cannot without the secret). The header crc32 is a cheap first check.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

MAGIC = b"HKVB"
VERSION = 2
MAX_KEY_LEN = 64
MAC_LEN = 16
SECRET_LEN = 32
SECRET_FILE = ".hintkv-secret"
_FIELDS = struct.Struct("<4sHH16sQ")
_CRC = struct.Struct("<I")
HEADER_SIZE = _FIELDS.size + MAX_KEY_LEN + MAC_LEN + _CRC.size


class BadBlockFile(ValueError):
    """The header does not describe the block the reader expects, or the MAC does not match."""


def block_mac(secret: bytes, key: bytes, fingerprint: bytes, payload) -> bytes:
    """BLAKE2b-128 keyed by `secret` over what a block file claims and holds."""
    h = hashlib.blake2b(key=secret, digest_size=MAC_LEN)
    h.update(fingerprint)
    h.update(len(key).to_bytes(1, "little") + key)
    h.update(payload)
    return h.digest()


def encode_header(key: bytes, fingerprint: bytes, payload_len: int, mac: bytes) -> bytes:
    if not 0 < len(key) <= MAX_KEY_LEN:
        raise ValueError(f"key length must be 1..{MAX_KEY_LEN}, got {len(key)}")
    if len(mac) != MAC_LEN:
        raise ValueError(f"a MAC is {MAC_LEN} bytes, got {len(mac)}")
    head = _FIELDS.pack(MAGIC, VERSION, len(key), fingerprint, payload_len)
    head += key.ljust(MAX_KEY_LEN, b"\0") + mac
    return head + _CRC.pack(zlib.crc32(head))


def decode_header(buf: bytes, fingerprint: bytes, payload_len: int,
                  key: bytes | None = None) -> tuple[bytes, bytes]:
    """Validate a header; return (key, MAC of the payload). Raises BadBlockFile on any mismatch."""
    if len(buf) != HEADER_SIZE:
        raise BadBlockFile(f"truncated header ({len(buf)} of {HEADER_SIZE} bytes)")
    body, (crc,) = buf[:-_CRC.size], _CRC.unpack(buf[-_CRC.size:])
    if zlib.crc32(body) != crc:
        raise BadBlockFile("header checksum mismatch")
    magic, version, key_len, fp, length = _FIELDS.unpack(body[:_FIELDS.size])
    if magic != MAGIC or version != VERSION:
        raise BadBlockFile(f"not a v{VERSION} block file (magic {magic!r}, version {version})")
    if fp != fingerprint:
        raise BadBlockFile("written for another block layout")
    if length != payload_len:
        raise BadBlockFile(f"payload length {length}, expected {payload_len}")
    if not 0 < key_len <= MAX_KEY_LEN:
        raise BadBlockFile(f"key length {key_len}")
    stored_key = body[_FIELDS.size:_FIELDS.size + key_len]
    if key is not None and stored_key != key:
        raise BadBlockFile("header names another key")
    mac = body[_FIELDS.size + MAX_KEY_LEN:]
    return stored_key, mac
