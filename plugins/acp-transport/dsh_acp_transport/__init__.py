"""acp-transport: the Agent Client Protocol front door over stdio, narrowed to automation.

Config (``[config.acp-transport]`` in an example's manifest):

- ``max-frame-bytes`` (int, default 67108864): the longest inbound line accepted; a longer
  one is answered with ``-32600`` and skipped, and the connection lives on.
- ``permission-timeout`` (seconds, default 300): an unanswered ``session/request_permission``
  fails closed (``unavailable``) after this long.
- ``usage-updates`` (bool, default false): after each turn whose model calls reported usage,
  send a ``usage_update`` session update (``used``: tokens in context, ``size``: the routed
  model's window). Off by default: the default wire carries committed text only.
- ``commands`` (bool, default false): offer the plugins' slash commands (``dsh_slash_commands``):
  ``available_commands_update`` after session/new, load and resume, and a prompt that starts
  with ``/name`` runs the command. Off by default: acp-agent passes ``/…`` to the model as text.
- ``max-tokens`` (``end_turn`` or ``max_tokens``, default ``end_turn``): the stop reason of a turn
  the model's output limit cut (``end_turn`` keeps ACP-7's automation contract, with
  ``_meta.dsh.turnEnd = "max-tokens"``; an editor shows ``max_tokens``).
- ``content-filter`` (``error`` or ``refusal``, default ``error``): the answer to a turn the
  provider's content filter stopped (``CONTENT_FILTER``): ACP-7's internal error, or the stop
  reason ``refusal`` an editor shows as the model declining.
- ``login`` (bool, default false): offer the route provider's login (``authMethods``: a terminal
  login when the client can run one, else one ``authenticate`` re-checks) and answer session/new,
  load and resume with ACP's auth-required error (-32000) while it has no credential, so an
  editor shows its login button. Off: ``authMethods`` is empty and a missing key fails the prompt.
- ``buffers`` (bool, default false): when the client advertises ``fs.readTextFile`` /
  ``fs.writeTextFile``, the file tools read workspace files from the editor (unsaved edits
  included; the disk still decides that the file exists) and mirror completed writes and edits to
  it (``AgentSpec.buffers``). Commands never run through the client's terminal.
- ``questions`` (bool, default false): when the client advertises ``elicitation.form``, tools may
  ask the person through ``elicitation/create`` (``AgentSpec.questions``; session-controls'
  ``ask_user_question``). Without it no tool can ask.
- ``prompt-usage`` (bool, default false): the prompt response also carries ACP's ``usage``
  (``totalTokens``, ``inputTokens``, ``outputTokens``, ``thoughtTokens``, ``cachedReadTokens`` of
  the turn's model calls), beside ``_meta.usage``. ACP marks the field unstable.
- ``stream`` (``committed`` or ``live``, default ``committed``): ``live`` sends an assistant
  message's text as the model writes it (the same ``messageId`` as the committed message; the
  committed text is then not sent again). What changes on cancel: text written before the cancel
  was already shown, and it is what the log commits as the interrupted message; a model call that
  fails and is retried may have shown text the log never holds (the retry is a new message).
  The default keeps ACP-6: committed output only.
- ``remember-approvals`` (bool, default false): a sandbox escalation's permission request also
  offers ``allow_always`` and ``reject_always``; either makes a rule for this session, this tool
  and this exact tier, answered without asking from then on, written to the session log and
  folded back on resume and load (an allow rule for danger-full-access is not taken from a
  file), listed and cleared by ``/approvals`` (with ``commands``). Off: every request is
  one-shot (ACP-9). See ``approvals.py``.
- ``prompt-queue`` (int, default 0): how many prompts may wait behind the one in flight in a
  session. A prompt sent during a turn waits and runs as its own turn after it (its own
  response, in order); ``session/cancel`` also answers every waiting prompt ``cancelled``,
  ``$/cancel_request`` takes one out of the line. 0 keeps ACP-5: such a prompt is refused.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Any

import anyio
from dsh_acp.fdstream import FdReader, FdWriter
from dsh_acp.rpc import Peer

from dsh_core import hookimpl
from dsh_core.stdio import claim_stdio

from .bridge import Bridge
from .config import TransportConfig

log = logging.getLogger("dsh.acp")

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host

NAME = "acp-transport"


@hookimpl
def dsh_config_type() -> tuple[str, type[TransportConfig]]:
    return NAME, TransportConfig


def make_bridge(host: Host, reader: FdReader, writer: FdWriter) -> Bridge:
    settings = host.config_for(TransportConfig)
    peer = Peer(reader, writer, max_frame=settings.max_frame_bytes, name="acp")
    return Bridge(host, peer, settings)


async def serve_bridge(bridge: Bridge) -> None:
    """Serve one ACP connection until EOF, then run the bridge's quiescence routine."""
    remove = bridge.host.approvals.add_answerer(bridge)
    try:
        await bridge.peer.serve(on_close=bridge.quiesce)
    finally:
        remove()


class AcpStdioDoor:
    name = "acp-stdio"

    async def serve(self, host: Host) -> None:
        stdin, stdout = claim_stdio()
        bridge = make_bridge(host, FdReader(stdin.fileno()), FdWriter(stdout.fileno()))
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                # SIGTERM/SIGINT/SIGHUP end the connection like stdin EOF: same quiescence.
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                    async for signum in signals:
                        log.warning(f"{signal.Signals(signum).name}: shutting down")
                        bridge.peer.stop_reading()
                        return

            tg.start_soon(on_signal)
            await serve_bridge(bridge)
            tg.cancel_scope.cancel()


@hookimpl(tryfirst=True)  # called first, offered last: after the commands a person uses more often
def dsh_slash_commands(session: Any, host: Host) -> list[Any] | None:
    """``/approvals`` when this door remembers approvals."""
    if not host.config_for(TransportConfig).remember_approvals:
        return None
    from .approvals import approvals_command

    return [approvals_command()]


@hookimpl
def dsh_register_front_doors(register: Any, host: Any) -> None:
    register(AcpStdioDoor())


@hookimpl
def dsh_register_commands(commands: Any) -> None:
    from . import ask

    commands.add(
        "ask",
        help="ask an example (or any ACP agent) one question headlessly; the answer goes to stdout",
        description=(
            "Spawn the example as an ACP agent, send TASK, print the committed answer to stdout. "
            "Exit 0 on end_turn, 130 when cancelled (Ctrl-C cancels, a second Ctrl-C kills), 124 on "
            "--timeout, 1 on failure. Keyless demo: dsh ask --provider scripted --model "
            "examples/acp-agent/demo.json ping"
        ),
        setup=ask.setup,
        run=ask.run,
    )
