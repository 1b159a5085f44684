"""Fault matrix, disk tier across a crash: `kill -9` of a serving process whose sessions were
written down to disk, some block files then corrupted, truncated or deleted, and a restart with
`--disk-cache-reuse`. The intact blocks come back (disk hits), the damaged ones are recomputed,
greedy outputs are identical to the run before the crash, and no temporary file is left."""

from __future__ import annotations

import os
import signal

import httpx
from faults import API_KEY, greedy, manage, metric, prompts, wait_until

from hintkv.bench.common import ServerProcess, hintkv_server

PROMPTS = prompts(6, length=64, seed=7)


def _server(disk: str, reuse: bool, mode: str = "lazy") -> ServerProcess:
    args = ["--api-key", API_KEY, "--dtype", "float32", "--device", "cpu", "--max-model-len", "256",
            "--kv-cache-tokens", "512", "--host-cache-memory", "256KiB", "--disk-cache-dir", disk,
            "--disk-cache-size", "64MiB", "--log-level", "warning", "--offload-mode", mode]
    if reuse:
        args.append("--disk-cache-reuse")
    return ServerProcess(hintkv_server("dummy:tiny", name="crash", extra_args=args))


def _tier_hits(client: httpx.Client, tier: str) -> float:
    text = client.get("/metrics", headers={"authorization": f"Bearer {API_KEY}"}).text
    key = f'hintkv_prefix_cache_hit_tokens_by_tier_total{{tier="{tier}"}}'
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(key)), 0.0)


def test_kill_9_then_reuse_serves_identical_outputs(tmp_path):
    disk = str(tmp_path / "kv")
    first = _server(disk, reuse=False).start()  # lazy: written at the hint
    try:
        with httpx.Client(base_url=first.base_url, timeout=120) as c:
            reference = [greedy(c, p, session=f"s{i}") for i, p in enumerate(PROMPTS)]
            for i in range(len(PROMPTS)):  # write every session down (host is tiny: to disk)
                assert manage(c, f"s{i}", "offload").status_code == 200
            assert wait_until(lambda: len([f for f in os.listdir(disk) if f.endswith(".kv")]) >= 6)
        assert first.proc is not None
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
    finally:
        first.stop()
    files = sorted(f for f in os.listdir(disk) if f.endswith(".kv"))
    damaged = files[:3]
    with open(os.path.join(disk, damaged[0]), "r+b") as f:  # corrupt one byte of the payload
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with open(os.path.join(disk, damaged[1]), "r+b") as f:  # truncate
        f.truncate(100)
    os.remove(os.path.join(disk, damaged[2]))  # delete
    with _server(disk, reuse=True) as again, httpx.Client(base_url=again.base_url, timeout=120) as c:
        outputs = [greedy(c, p, session=f"s{i}") for i, p in enumerate(PROMPTS)]
        assert outputs == reference
        assert _tier_hits(c, "disk") > 0  # what was fully written came back
        assert metric(c, "hintkv_internal_errors_total") == 0
    assert not [f for f in os.listdir(disk) if f.endswith(".tmp")]


def test_kill_9_under_deferred_offload_recomputes_what_the_device_still_held(tmp_path):
    """The default `deferred` writes nothing at an offload hint (docs/protocol.md): a session the
    device has not evicted yet is on no disk when the process dies, so a restart recomputes it,
    with the same greedy output, and its offload reply moved no block down."""
    disk = str(tmp_path / "kv")
    first = _server(disk, reuse=False, mode="deferred").start()
    try:
        with httpx.Client(base_url=first.base_url, timeout=120) as c:
            reference = [greedy(c, p, session=f"s{i}") for i, p in enumerate(PROMPTS)]
            last = len(PROMPTS) - 1  # the latest session: on the device, nothing of it evicted
            reply = manage(c, f"s{last}", "offload")
            assert reply.status_code == 200
            tiers = reply.json()["agent_hint_result"]["edits"][0]["tiers"]
            assert tiers.get("host", {"blocks": 0})["blocks"] == 0
            assert tiers.get("disk", {"blocks": 0})["blocks"] == 0
        assert first.proc is not None
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
    finally:
        first.stop()
    with _server(disk, reuse=True, mode="deferred") as again, \
            httpx.Client(base_url=again.base_url, timeout=120) as c:
        assert greedy(c, PROMPTS[last], session=f"s{last}") == reference[last]
        assert _tier_hits(c, "disk") == 0  # recomputed: nothing of it had gone down
