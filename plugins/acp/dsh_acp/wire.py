"""ACP v1 wire types as msgspec Structs (camelCase on the wire, snake_case in Python): the one
set both sides of dsh use. The door (acp-transport) decodes the client → agent messages and
encodes the agent → client ones; the client (``dsh_acp.client``) encodes the former and
decodes the latter with the same Structs.

Decoding tolerates unknown fields and ``_meta``; encoding omits unset optional fields and
validates against ``acp/schema.json`` in the tests. What dsh sends is exact (tagged unions,
required members); an agent that is not dsh may send more than that, so the client reads
``session/update``, ``initialize``'s answer and ``session/request_permission`` through the
``Lenient*`` Structs at the end, where every member is optional.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

PROTOCOL_VERSION = 1


class _In(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """Client → agent (decoded by the door, encoded by the client): unknown fields (and
    ``_meta``) are ignored when decoding; members left at their default are not sent."""


class _Out(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """Outbound: exact, optional fields omitted when unset."""


# --------------------------------------------------------------------------- JSON-RPC envelope

RequestId = int | str | None


class Frame(msgspec.Struct, kw_only=True):
    """Any inbound JSON object; ``params``/``result`` stay raw until the method is known.

    Members are untyped so that every object decodes and the reader itself classifies it
    (a response with a malformed ``error`` must still settle its request)."""

    jsonrpc: Any = UNSET
    id: Any = UNSET
    method: Any = UNSET
    params: msgspec.Raw | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: Any = UNSET


class RpcError(_Out):
    code: int
    message: str
    data: Any = UNSET


class Response(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: RequestId
    result: Any


class ErrorResponse(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: RequestId
    error: RpcError


class Request(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: RequestId
    method: str
    params: Any


class Notification(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    method: str
    params: Any


# --------------------------------------------------------------------------- initialize


class InitializeParams(_In):
    protocol_version: int
    client_capabilities: dict[str, Any] | None = None
    client_info: dict[str, Any] | None = None


class ReadTextFileParams(_Out):
    session_id: str
    path: str


class ReadTextFileResult(_In):
    content: str


class WriteTextFileParams(_Out):
    session_id: str
    path: str
    content: str


class ElicitationParams(_Out):
    """``elicitation/create`` in form mode, scoped to a session (and a tool call)."""

    session_id: str
    mode: str  # "form" (no default: omitted defaults would drop it, and clients require it)
    message: str
    requested_schema: dict[str, Any]
    tool_call_id: str | UnsetType = UNSET


class ElicitationResult(_In):
    action: str
    content: dict[str, Any] | None = None


class AuthenticateParams(_In):
    method_id: str


class LogoutParams(_In):
    """ACP ``logout`` (no fields but ``_meta``)."""


class PromptCapabilities(msgspec.Struct, rename="camel", kw_only=True):
    """Sent in full: every capability is stated, true or false."""

    image: bool = False
    audio: bool = False
    embedded_context: bool = False


class SessionCapabilities(_Out):
    """Optional session methods: a member is sent (as ``{}``) only when the method is supported."""

    close: dict[str, Any] | UnsetType = UNSET
    list: dict[str, Any] | UnsetType = UNSET
    resume: dict[str, Any] | UnsetType = UNSET
    delete: dict[str, Any] | UnsetType = UNSET
    fork: dict[str, Any] | UnsetType = UNSET  # unstable ACP (session/fork)
    additional_directories: dict[str, Any] | UnsetType = UNSET


class McpCapabilities(_Out):
    http: bool = False
    sse: bool = False


class AgentAuthCapabilities(_Out):
    logout: dict[str, Any] | UnsetType = UNSET  # {}: the agent answers ``logout``


class AgentCapabilities(_Out):
    prompt_capabilities: PromptCapabilities
    session_capabilities: SessionCapabilities | UnsetType = UNSET
    load_session: bool | UnsetType = UNSET  # sent (true) only with a durable session store
    mcp_capabilities: McpCapabilities | UnsetType = UNSET  # sent only when the composition takes client MCP servers
    auth: AgentAuthCapabilities | UnsetType = UNSET  # sent only when the door offers logout (acp-editor)
    meta: dict[str, Any] | UnsetType = msgspec.field(default=UNSET, name="_meta")  # acp-editor's prompt queue


class Implementation(_Out):
    name: str
    version: str
    title: str | UnsetType = UNSET


class InitializeResult(_Out):
    protocol_version: int
    agent_capabilities: AgentCapabilities
    agent_info: Implementation
    auth_methods: list[Any]  # required (no default) so it is sent even when empty


# --------------------------------------------------------------------------- sessions


class NameValue(_In):
    """An ``EnvVariable`` or an ``HttpHeader`` of an MCP server."""

    name: str
    value: str


class McpServerStdio(_In):
    """An ``mcpServers`` entry without ``type`` (or ``type: "stdio"``)."""

    name: str
    command: str
    args: list[str] = msgspec.field(default_factory=list)
    env: list[NameValue] = msgspec.field(default_factory=list)
    type: Literal["stdio"] = "stdio"


class McpServerRemote(_In):
    """An ``mcpServers`` entry with ``type: "http"`` or ``"sse"``."""

    type: Literal["http", "sse"]
    name: str
    url: str
    headers: list[NameValue] = msgspec.field(default_factory=list)


class NewSessionParams(_In):
    cwd: str
    mcp_servers: list[Any] | None = None
    additional_directories: list[Any] | None = None
    # read for its W3C trace context keys (traceparent, tracestate): the ACP convention
    meta: Any = msgspec.field(default=None, name="_meta")


TRACE_KEYS = ("traceparent", "tracestate")


def trace_context(meta: Any) -> dict[str, str]:
    """The W3C trace context in a request's ``_meta`` (string values only; anything else: none)."""
    if not isinstance(meta, dict):
        return {}
    return {k: meta[k] for k in TRACE_KEYS if isinstance(meta.get(k), str) and meta[k]}


class AuthMethodOut(_Out):
    """An ``authMethods`` entry: ``type`` ``terminal`` (the client runs the agent's command with
    ``args`` in a terminal) or unset (``agent``: the client calls ``authenticate``)."""

    id: str
    name: str
    description: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    args: list[str] | UnsetType = UNSET


class ConfigChoice(_Out):
    """A value of a select ``SessionConfigOption``."""

    value: str
    name: str
    description: str | UnsetType = UNSET


class ConfigOption(_Out, tag="select", tag_field="type"):
    """A ``SessionConfigOption`` of type ``select`` (a dropdown: model, thought level, mode)."""

    id: str
    name: str
    current_value: str
    options: list[ConfigChoice]
    description: str | UnsetType = UNSET
    category: str | UnsetType = UNSET


class BooleanConfigOption(_Out, tag="boolean", tag_field="type"):
    """A ``SessionConfigOption`` of type ``boolean`` (an on/off toggle), for a client that
    advertised ``clientCapabilities.session.configOptions.boolean``."""

    id: str
    name: str
    current_value: bool
    description: str | UnsetType = UNSET
    category: str | UnsetType = UNSET


AnyConfigOption = ConfigOption | BooleanConfigOption


class SessionMode(_Out):
    id: str
    name: str
    description: str | UnsetType = UNSET


class SessionModeState(_Out):
    """The legacy ``modes`` of session/new, load and resume (clients before config options)."""

    current_mode_id: str
    available_modes: list[SessionMode]


class NewSessionResult(_Out):
    session_id: str
    config_options: list[AnyConfigOption] | UnsetType = UNSET
    modes: SessionModeState | UnsetType = UNSET


class SetConfigOptionParams(_In):
    session_id: str
    config_id: str
    value: Any = None
    type: str | None = None


class SetConfigOptionResult(_Out):
    config_options: list[AnyConfigOption]


class SetModeParams(_In):
    session_id: str
    mode_id: str


class TextIn(_In, tag="text", tag_field="type"):
    text: str


class ImageIn(_In, tag="image", tag_field="type"):
    data: str
    mime_type: str
    uri: str | None = None


class AudioIn(_In, tag="audio", tag_field="type"):
    data: Any = None
    mime_type: Any = None


class ResourceLinkIn(_In, tag="resource_link", tag_field="type"):
    name: str
    uri: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None


class ResourceIn(_In, tag="resource", tag_field="type"):
    resource: Any = None


ContentIn = TextIn | ImageIn | AudioIn | ResourceLinkIn | ResourceIn


class PromptParams(_In):
    session_id: str
    prompt: list[msgspec.Raw]


class CancelParams(_In):
    session_id: str


class CloseSessionParams(_In):
    session_id: str


class ResumeSessionParams(_In):
    session_id: str
    cwd: str
    mcp_servers: list[Any] | None = None
    additional_directories: list[Any] | None = None


class LoadSessionParams(ResumeSessionParams):
    """``session/load``: as resume, and the conversation is replayed to the client first."""


class ForkSessionParams(ResumeSessionParams):
    """``session/fork`` (unstable ACP): a new session from the committed history of ``session_id``."""


class DeleteSessionParams(_In):
    session_id: str


class ListSessionsParams(_In):
    cwd: str | None = None
    cursor: str | None = None


class SessionInfo(_Out):
    session_id: str
    cwd: str
    title: str | UnsetType = UNSET
    updated_at: str | UnsetType = UNSET


class ListSessionsResult(_Out):
    sessions: list[SessionInfo]
    next_cursor: str | UnsetType = UNSET


class CancelRequestParams(_In):
    request_id: int | str | None


StopReason = Literal["end_turn", "cancelled", "max_turn_requests"]
"""The stop reasons the door answers with; other agents also send max_tokens, refusal, …"""


class TokenUsage(_Out):
    """ACP's ``PromptResponse.usage`` (End-Turn Token Usage, unstable in v1.21): the turn's tokens."""

    total_tokens: int
    input_tokens: int
    output_tokens: int
    thought_tokens: int | UnsetType = UNSET
    cached_read_tokens: int | UnsetType = UNSET


class PromptResult(_Out):
    stop_reason: str  # a StopReason from the door; any string from another agent
    usage: TokenUsage | UnsetType = UNSET  # acp-editor ([config.acp-transport] prompt-usage)
    meta: dict[str, Any] | UnsetType = msgspec.field(default=UNSET, name="_meta")


# --------------------------------------------------------------------------- agent → client


class TextOut(_Out, tag="text", tag_field="type"):
    text: str


class ImageOut(_Out, tag="image", tag_field="type"):
    data: str
    mime_type: str


class MessageChunk(_Out, tag="agent_message_chunk", tag_field="sessionUpdate"):
    content: TextOut | ImageOut
    message_id: str | UnsetType = UNSET  # chunks of one assistant message share it


class UserMessageChunk(_Out, tag="user_message_chunk", tag_field="sessionUpdate"):
    """A user message replayed by ``session/load`` (the conversation shown again)."""

    content: TextOut | ImageOut
    message_id: str | UnsetType = UNSET


class CostOut(_Out):
    amount: float
    currency: str


class UsageUpdate(_Out, tag="usage_update", tag_field="sessionUpdate"):
    used: int
    size: int
    cost: CostOut | UnsetType = UNSET


TOOL_KINDS = frozenset({"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"})


class ContentOut(_Out, tag="content", tag_field="type"):
    """Tool-call content: a standard content block (ACP ToolCallContent ``content``)."""

    content: TextOut


class DiffOut(_Out, tag="diff", tag_field="type"):
    """Tool-call content: a file change (ACP ``Diff``); ``old_text`` None is a new file."""

    path: str
    old_text: str | None  # no default: sent as null for a new file
    new_text: str


class ToolCallLocation(_Out):
    path: str
    line: int | UnsetType = UNSET


class ToolCallStart(_Out, tag="tool_call", tag_field="sessionUpdate"):
    """A tool call the model made (ACP ``ToolCall``): the card an editor shows."""

    tool_call_id: str
    title: str
    kind: str
    status: str
    locations: list[ToolCallLocation] | UnsetType = UNSET
    raw_input: Any = UNSET


class ToolCallProgress(_Out, tag="tool_call_update", tag_field="sessionUpdate"):
    """A change of a shown tool call (ACP ``ToolCallUpdate``): its status, then its output."""

    tool_call_id: str
    status: str | UnsetType = UNSET
    content: list[ContentOut | DiffOut] | UnsetType = UNSET
    raw_output: Any = UNSET  # on the final update: the tool's result as data (acp-presentation)


class ThoughtChunk(_Out, tag="agent_thought_chunk", tag_field="sessionUpdate"):
    content: TextOut
    message_id: str | UnsetType = UNSET


class PlanEntry(_Out):
    content: str
    priority: str
    status: str


class PlanUpdate(_Out, tag="plan", tag_field="sessionUpdate"):
    entries: list[PlanEntry]


class SessionInfoUpdate(_Out, tag="session_info_update", tag_field="sessionUpdate"):
    title: str | UnsetType = UNSET
    updated_at: str | UnsetType = UNSET  # ISO 8601


class ConfigOptionUpdate(_Out, tag="config_option_update", tag_field="sessionUpdate"):
    config_options: list[AnyConfigOption]


class CurrentModeUpdate(_Out, tag="current_mode_update", tag_field="sessionUpdate"):
    current_mode_id: str


class CommandInput(_Out):
    """What a command takes: the text typed after its name (ACP ``UnstructuredCommandInput``)."""

    hint: str


class AvailableCommand(_Out):
    name: str
    description: str
    input: CommandInput | UnsetType = UNSET


class AvailableCommandsUpdate(_Out, tag="available_commands_update", tag_field="sessionUpdate"):
    available_commands: list[AvailableCommand]


SessionUpdate = (MessageChunk | UserMessageChunk | UsageUpdate | ToolCallStart | ToolCallProgress | ThoughtChunk | PlanUpdate
                 | SessionInfoUpdate | ConfigOptionUpdate | CurrentModeUpdate | AvailableCommandsUpdate)


class SessionNotification(_Out):
    session_id: str
    update: SessionUpdate


class PermissionToolCall(_Out):
    """``toolCall`` of a permission request (ACP's ToolCallUpdate): what a person judges. Clients
    show ``title`` and ``content`` (the reason, a diff view for a file change), not ``rawInput``."""

    tool_call_id: str
    kind: str | UnsetType = UNSET
    title: str | UnsetType = UNSET
    content: list[ContentOut | DiffOut] | UnsetType = UNSET
    raw_input: Any = UNSET


class PermissionOption(_Out):
    option_id: str
    name: str
    kind: str


PERMISSION_OPTIONS = [
    PermissionOption(option_id="allow-once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="reject-once", name="Reject once", kind="reject_once"),
]


class PermissionParams(_Out):
    session_id: str
    tool_call: PermissionToolCall
    options: list[PermissionOption]


class PermissionOutcome(_In):
    outcome: str
    option_id: str | None = None


class PermissionResult(_In):
    outcome: PermissionOutcome


# --------------------------------------------------------------------------- read leniently by the client
# The same messages as above, as any ACP agent may send them: every member optional, unknown
# kinds of update and content kept as plain strings (the client ignores what it does not use).


class LenientInitializeResult(_In):
    protocol_version: Any = None
    agent_info: dict[str, Any] | None = None
    agent_capabilities: dict[str, Any] | None = None


class LenientContent(_In):
    type: str = ""
    text: str | None = None


class LenientUpdate(_In):
    session_update: str = ""
    content: LenientContent | None = None


class LenientSessionNotification(_In):
    session_id: str = ""
    update: LenientUpdate | None = None


class LenientOption(_In):
    option_id: str
    kind: str = ""
    name: str = ""


class LenientToolCall(_In):
    tool_call_id: str = ""
    title: str | None = None
    kind: str | None = None
    raw_input: Any = None


class LenientPermissionParams(_In):
    session_id: str = ""
    tool_call: LenientToolCall | None = None
    options: list[LenientOption] = msgspec.field(default_factory=list)


encoder = msgspec.json.Encoder()
