"""Loaders of real agent traces into `hintkv.workload.program` scripts.

    sessions = load_claude_code("/work/shared/traces/claude-code")   # list[ClaudeCodeSession]
    runs = load_swe_agent("/work/shared/traces/swe-agent")            # list[SweAgentRun]
    task = sessions[0].task("u0-t0", Scale(token_scale=0.25))

Each loaded trace builds `Task`s under any task id (so one trace can serve several users, each
replay a distinct conversation when `salt` differs). `files.trace_files` reads any folder of
these formats, gzip-compressed or not.
"""

from hintkv.workload.traces.claude_code import ClaudeCodeSession, load_claude_code
from hintkv.workload.traces.files import DEFAULT_SCALE, Scale, trace_files
from hintkv.workload.traces.swe_agent import SweAgentRun, load_swe_agent, team_task

__all__ = ["DEFAULT_SCALE", "ClaudeCodeSession", "Scale", "SweAgentRun", "load_claude_code", "load_swe_agent", "team_task",
           "trace_files"]
