"""``[config.acp-transport]``: what the door does beyond ACP-1…13, each off for acp-agent (see
the package docstring and README.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from dsh_acp.rpc import DEFAULT_MAX_FRAME
from msgspec import Meta

from dsh_core.config import PluginConfig


class TransportConfig(PluginConfig):
    """[config.acp-transport]"""

    max_frame_bytes: Annotated[int, Meta(gt=0, description="the longest inbound line, in bytes")] = DEFAULT_MAX_FRAME
    permission_timeout: Annotated[float, Meta(
        gt=0, description="seconds before an unanswered permission request fails closed")] = 300.0
    usage_updates: Annotated[bool, Meta(description="send usage_update after each turn")] = False
    commands: Annotated[bool, Meta(description="offer the plugins' slash commands and run /name prompts")] = False
    max_tokens: Annotated[Literal["end_turn", "max_tokens"], Meta(
        description="the stop reason of a turn cut by the model's output limit")] = "end_turn"
    content_filter: Annotated[Literal["error", "refusal"], Meta(
        description="the answer to a turn the provider's content filter stopped (DeepSeek's finish_reason "
                    "content_filter): a JSON-RPC error (ACP-7) or stopReason refusal")] = "error"
    login: Annotated[bool, Meta(description="offer the provider's login; auth-required while it has no credential")] = False
    buffers: Annotated[bool, Meta(description="read and mirror workspace files through the editor (fs/*)")] = False
    questions: Annotated[bool, Meta(description="let tools ask the person through the editor (elicitation/create)")] = False
    prompt_usage: Annotated[bool, Meta(description="put the turn's tokens in the prompt response's usage")] = False
    stream: Annotated[Literal["committed", "live"], Meta(
        description="committed: each assistant message once it is committed (ACP-6); live: its text as it is written")] = (
        "committed")
    waiting: Annotated[float, Meta(
        ge=0, description="seconds a model call may be silent before the person is told it is still waiting "
                          "(an agent_thought_chunk, repeated as long as it lasts); 0: never")] = 0.0
    remember_approvals: Annotated[bool, Meta(
        description="offer allow_always and reject_always for a sandbox escalation: a rule for this session, tool "
                    "and tier, kept in the session log, listed and cleared by /approvals; off: one-shot (ACP-9)")] = False
    prompt_queue: Annotated[int, Meta(
        ge=0, le=64, description="how many prompts may wait behind the one in flight in a session (a prompt sent "
                                 "during a turn runs as its own turn after it); 0: such a prompt is refused (ACP-5)")] = 0
    fork: Annotated[bool, Meta(
        description="serve session/fork (unstable ACP): a new session with the committed history and settings of "
                    "a recorded one")] = False
    additional_directories: Annotated[bool, Meta(
        description="take additionalDirectories in session/new, load, resume and fork: more sandbox roots of the "
                    "session's tier (off: a non-empty list is refused, ACP-3)")] = False
