"""PNG plots of `hintkv bench swarm`: TTFT CDFs, hit rate vs capacity with the oracle, host occupancy."""

from __future__ import annotations

import os
from typing import Any


def plot_all(folder: str, live: dict[str, Any], sweep: dict[float, dict], offline: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    out = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in live.items():
        ttft = sorted(c.ttft_s for c in r.calls if c.ok)
        if ttft:
            ax.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], label=name)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of calls")
    ax.set_title("TTFT CDF (live)")
    ax.legend()
    out.append(_save(fig, folder, "swarm_ttft_cdf.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    fracs = sorted(sweep)
    for name in ("lru", "lru+host", "sam", "sam+host", "qlru+host", "oracle", "oracle+host"):
        style = "--" if name.startswith("oracle") else "-"
        ax.plot(fracs, [sweep[f][name]["hit_rate"] for f in fracs], style, marker="o", label=name)
    ax.set_xlabel("device capacity / working set")
    ax.set_ylabel("token hit rate")
    ax.set_title("hit rate vs capacity (offline replay)")
    ax.legend()
    out.append(_save(fig, folder, "swarm_hit_rate_vs_capacity.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("lru+host", "sam+host", "qlru+host"):
        s = offline.get(name, {}).get("host_samples") or []
        if s:
            ax.step([t for t, _ in s], [n for _, n in s], where="post", label=name)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("host tier blocks")
    ax.set_title("host tier occupancy (offline replay)")
    ax.legend()
    out.append(_save(fig, folder, "swarm_host_occupancy.png"))
    return out


def _save(fig, folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
