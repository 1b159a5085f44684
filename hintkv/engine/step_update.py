"""The second half of a step: what the runner's output does to the scheduler's sequences.

`update_from_output` (called as `Scheduler.update_from_output`) takes what the runner sampled
for each scheduled sequence: advances it over the KV it computed (real tokens, then the drafts
the runner accepted; rejected drafts give their blocks back), appends the tokens until a stop
condition holds, indexes its newly full blocks (`KVCacheManager.commit`) and finishes it
when it stopped (its session then holds its blocks). No tensors: a simulator or a test hands
in made-up `ModelRunnerOutput`s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hintkv.engine import ttft
from hintkv.engine.outputs import ModelRunnerOutput, SchedulerOutput
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.engine.types import RequestMetrics, RequestOutput

if TYPE_CHECKING:
    from hintkv.engine.scheduler import Scheduler


def update_from_output(sch: Scheduler, sched: SchedulerOutput,
                       runner: ModelRunnerOutput) -> list[RequestOutput]:
    """Apply one step's results to `sch`; returns what each touched request produced."""
    if len(runner.sampled_token_ids) != len(sched.scheduled):
        raise ValueError(f"runner output has {len(runner.sampled_token_ids)} entries for "
                         f"{len(sched.scheduled)} scheduled sequences")
    sch.check_flushed(sched)  # a forward ran: the driver flushed (catches a missing flush only)
    outputs = [sch.finish(seq, "length") for seq in sched.out_of_room
               if seq.status is not SeqStatus.FINISHED]  # (unless aborted meanwhile)
    now = sch.clock()  # the step's tokens all arrive now
    ttft.stepped(sched, now)
    sch.admission.stepped(sched, now)
    kv = sch.kv
    if kv.tiers is not None and runner.forward_s is not None and sched.scheduled:
        kv.tiers.costs.observe_prefill(sched.num_batched_tokens, runner.forward_s)
    # per sequence, in one pass: what a decode step needs (one token, no drafts) costs a few
    # attribute reads. A sequence stops on an EOS token (unless ignore_eos) or a stop token
    # ("stop"), or at max_tokens outputs or max_model_len tokens ("length")
    eos, max_len, bs = sch.eos_token_ids, sch.max_model_len, kv.block_size
    running = SeqStatus.RUNNING
    for s, tokens in zip(sched.scheduled, runner.sampled_token_ids):
        seq = s.seq
        if seq.status is not running:
            continue  # aborted while the forward ran
        c = seq.num_computed_tokens
        drafts = len(s.spec_token_ids)
        real = s.num_new_tokens - drafts
        n_prompt = seq.num_prompt_tokens
        if c < n_prompt:
            sch.num_prompt_tokens_computed += min(n_prompt, c + real) - c
        seq.num_computed_tokens = c + real
        reason = None
        if tokens:
            ids = seq.token_ids
            p = seq.sampling
            ignore_eos, stop_ids, max_tokens = p.ignore_eos, p.stop_token_ids, p.max_tokens
            kept = 0
            for tok in tokens:
                ids.append(tok)
                kept += 1
                if (tok in eos and not ignore_eos) or tok in stop_ids:
                    reason = "stop"
                elif len(ids) - n_prompt >= max_tokens or (max_len is not None
                                                           and len(ids) >= max_len):
                    reason = "length"
                else:
                    continue
                break
            if len(tokens) > 1:  # accepted drafts have KV
                seq.num_computed_tokens += min(kept, len(tokens) - 1)
            if seq.first_token_time is None:
                seq.first_token_time = now
            seq.last_token_time = now
        if drafts:  # rejected drafts: their KV is never committed; blocks go back
            accepted = max(0, len(tokens) - 1)
            sch.num_draft_tokens += drafts
            sch.num_accepted_tokens += accepted
            seq.num_draft_tokens += drafts
            seq.num_accepted_tokens += accepted
            kv.truncate(seq, seq.num_tokens)
        if seq.num_computed_tokens // bs > seq.num_registered_blocks:
            kv.commit(seq)  # a newly full block (one decode step in `block_size`)
        if reason is not None:
            outputs.append(sch.finish(seq, reason))
        elif tokens:
            outputs.append(request_output(seq))
    return outputs


def request_output(seq: Sequence, finished: bool = False,
                   metrics: RequestMetrics | None = None) -> RequestOutput:
    """The tokens of `seq` not sent yet, as one `RequestOutput` (marks them sent)."""
    ids, n_prompt = seq.token_ids, seq.num_prompt_tokens
    new = ids[n_prompt + seq.num_sent_tokens:]
    seq.num_sent_tokens += len(new)
    return RequestOutput(seq.request_id, new, finished, seq.finish_reason, n_prompt,
                         seq.num_cached_tokens, len(ids) - n_prompt, None, metrics)
