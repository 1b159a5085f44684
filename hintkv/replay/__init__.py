"""Offline replay of agent workloads through the real cache code, and the Belady oracle.

    from hintkv.replay import OfflineConfig, replay_offline, belady
"""

from hintkv.replay.offline import OfflineConfig, OfflineResult, replay_offline
from hintkv.replay.oracle import OracleResult, belady, belady_pinned, peak_live_blocks

__all__ = ["OfflineConfig", "OfflineResult", "OracleResult", "belady", "belady_pinned", "peak_live_blocks",
           "replay_offline"]
