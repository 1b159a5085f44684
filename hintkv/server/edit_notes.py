"""The English of `agent_hint_result`: what the cache's counts mean, said for clients.

The cache reports numbers (`EditOutcome`: blocks moved per tier, blocks held, scheduled, left
in place, a reason code); only this module turns them into the `notes` of an edit's result.
"""

from __future__ import annotations

from hintkv.engine.types import EditOutcome

_REASONS = {
    "unknown_session": "unknown session: nothing to do",
    "hints_ignored": "hints are ignored by this server (--ignore-hints)",
}


def edit_notes(o: EditOutcome) -> list[str]:
    """Notes for one outcome (empty when the figures say it all)."""
    if o.reason == "engine_error":
        return [f"engine error: {o.detail}"]
    if o.reason is not None:
        return [_REASONS[o.reason]]
    if o.action == "offloaded":
        if o.lower_tier is None:
            return [(f"no lower tier configured: {o.num_on_device} device blocks of this session "
                     "are now first in line for eviction (kept until room is needed)")]
        then = {"eager": "their device copies are dropped once the writes land (blocks a running request uses "
                         "stay)",
                "lazy": "their device copies stay cached"
                        + ("" if o.range_edit else ", first in line when room is needed"),
                "deferred": "the session is first in line for eviction; its blocks are written down when "
                            "evicted"}.get(o.offload_mode or "eager")
        return [(f"scheduled: {o.num_scheduled} device blocks are being written to {o.lower_tier} "
                 f"and {o.num_below} already sit below; {then}")]
    if o.action == "prefetched":
        if o.lower_tier is None:
            return [(f"{o.num_on_device} of the session's {o.num_held} blocks are in device memory "
                     "and now protected")]
        notes = [(f"scheduled: {o.num_scheduled} blocks are being loaded into device memory; "
                  f"{o.num_on_device} of the session's {o.num_held} blocks were there already and "
                  "are now protected")]
        if o.num_scheduled < o.num_below:
            notes.append(f"{o.num_below - o.num_scheduled} blocks stay below: no device room "
                         "without pushing out running sessions' blocks (or not a contiguous prefix)")
        return notes
    if o.num_not_freed:
        return [f"{o.num_not_freed} released blocks are still in use by running requests or gone"]
    return []
