"""What a person changes and types in an editor, when the composition offers it: a session's
settings as ACP config options (and the legacy modes), and slash commands.

Settings come from ``dsh_session_controls``: with no implementation mounted (acp-agent) the
door offers none, ``session/set_config_option`` and ``session/set_mode`` answer ``-32601``
as any unknown method does, and every response is what it was. Commands come from
``dsh_slash_commands`` and are offered only with ``[config.acp-transport] commands = true``:
then ``available_commands_update`` follows the answer to session/new, load and resume, and a
prompt that starts with ``/name`` runs the command (an unknown name is answered with the list).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from dsh_acp import wire
from dsh_acp.display import one_line
from dsh_acp.rpc import METHOD_NOT_FOUND, RpcFailure, decode_params, invalid_params, shown

from dsh_core.contracts import new_id
from dsh_core.types import Note, TextBlock

from .state import BridgeState, Session, Slot

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, Control, SlashCommand

log = logging.getLogger("dsh.acp")

# Notes in the session log of what a person typed as a command (``session/load`` shows it again):
# a command that answered by itself (the typed text and the answer), and one whose prompt went to
# the model (the typed text and that prompt's message id).
COMMAND_ANSWERED = "acp/command-answered"
COMMAND_TYPED = "acp/command-typed"

# ``/name`` then a space or the end: ``/usr/bin is slow`` is a prompt, not a command.
COMMAND = re.compile(r"/([A-Za-z][\w-]{0,63})(?:\s+|$)")


def config_options(controls: list[Control], booleans: bool = False) -> list[wire.AnyConfigOption]:
    """The controls as ACP config options: a ``boolean`` control as a ``boolean`` option
    (``currentValue`` true or false) when the client takes them (``booleans``), else as a select
    of ``on`` and ``off``, which every client with config options shows."""
    return [
        wire.BooleanConfigOption(
            id=c.id, name=c.name, current_value=c.current == "on",
            **({"category": c.category} if c.category else {}),
            **({"description": c.description} if c.description else {}),
        )
        if c.boolean and booleans else
        wire.ConfigOption(
            id=c.id, name=c.name, current_value=c.current,
            options=[wire.ConfigChoice(value=ch.value, name=ch.name, **({"description": ch.description}
                                                                        if ch.description else {}))
                     for ch in c.choices],
            **({"category": c.category} if c.category else {}),
            **({"description": c.description} if c.description else {}),
        )
        for c in controls
    ]


def modes_of(controls: list[Control]) -> wire.SessionModeState | None:
    """The legacy ``modes`` mirror of the ``mode`` control, for clients before config options."""
    for c in controls:
        if c.category == "mode":
            return wire.SessionModeState(
                current_mode_id=c.current,
                available_modes=[wire.SessionMode(id=ch.value, name=ch.name,
                                                  **({"description": ch.description} if ch.description else {}))
                                 for ch in c.choices],
            )
    return None


class Controls(BridgeState):
    """Config options, modes and slash commands of the connection's sessions."""

    def controls(self, agent: Agent) -> list[Control]:
        return [c for found in self.host.pm.hook.dsh_session_controls(session=agent, host=self.host) if found
                for c in found]

    def commands(self, agent: Agent) -> list[SlashCommand]:
        if not self.settings.commands:
            return []
        seen: dict[str, SlashCommand] = {}
        for found in reversed(self.host.pm.hook.dsh_slash_commands(session=agent, host=self.host)):
            for command in found or ():
                seen.setdefault(command.name, command)  # pluggy calls the last registered first
        return list(seen.values())

    def booleans(self) -> bool:
        """Whether the client takes ``boolean`` config options (``session.configOptions.boolean``)."""
        session = self.client_capabilities.get("session")
        options = session.get("configOptions") if isinstance(session, dict) else None
        return isinstance(options, dict) and isinstance(options.get("boolean"), dict)

    def _offers_controls(self, method: str) -> None:
        if not self.host.pm.hook.dsh_session_controls.get_hookimpls():
            raise RpcFailure(METHOD_NOT_FOUND, "Method not found", {"method": method},
                             details=f"method not found: {method}")

    def session_state(self, agent: Agent) -> dict[str, Any]:
        """``configOptions`` and ``modes`` of a session/new, load or resume answer, by their wire
        names (none: {})."""
        controls = self.controls(agent)
        if not controls:
            return {}
        modes = modes_of(controls)
        return {"configOptions": config_options(controls, self.booleans()), **({"modes": modes} if modes is not None else {})}

    def _commands_update(self, session: Session) -> wire.AvailableCommandsUpdate | None:
        """The session's commands as an update, when they differ from what it was last sent."""
        listed = [wire.AvailableCommand(name=c.name, description=one_line(c.description, 200),
                                        **({"input": wire.CommandInput(hint=c.hint)} if c.hint else {}))
                  for c in self.commands(session.agent)]
        if listed == session.commands_sent:
            return None
        session.commands_sent = listed
        return wire.AvailableCommandsUpdate(available_commands=listed)

    def opened(self, rid: Any, session: Session) -> None:
        """After the answer that opened ``session``: the commands it offers."""
        update = self._commands_update(session) if self.settings.commands else None
        if update is not None and update.available_commands:
            self.peer.after_reply(rid, lambda: session.delivery.push_update(update))

    def turn_ended(self, session: Session) -> None:
        """After each turn: the commands again, if the set changed (a plugin added or dropped one)."""
        update = self._commands_update(session)
        if update is not None:
            session.delivery.push_update(update)

    def settings_changed(self, session: Session, changed: list[str]) -> None:
        """Every change of a session's settings, whoever made it: ``config_option_update`` with the
        whole set, and ``current_mode_update`` when the mode changed."""
        controls = self.controls(session.agent)
        if not controls:
            return
        session.delivery.push_update(wire.ConfigOptionUpdate(config_options=config_options(controls, self.booleans())))
        modes = modes_of(controls)
        if "mode" in changed and modes is not None:
            session.delivery.push_update(wire.CurrentModeUpdate(current_mode_id=modes.current_mode_id))

    # ------------------------------------------------------------------ set_config_option, set_mode

    def _set(self, session_id: str, pick: Any, value: str, what: str) -> list[Control]:
        session = self.sessions.get(session_id)
        if session is None:
            raise invalid_params(f"unknown session: {shown(session_id)}")
        controls = self.controls(session.agent)
        control = next((c for c in controls if pick(c)), None)
        if control is None:
            raise invalid_params(f"{what} is not a setting of this session"
                                 + (f" (it has: {', '.join(c.id for c in controls)})" if controls else ""))
        if value not in {ch.value for ch in control.choices}:
            raise invalid_params(f"{shown(value)} is not a value of {control.id} "
                                 f"(one of: {', '.join(ch.value for ch in control.choices)})")
        try:
            control.apply(value)
        except ValueError as exc:
            raise invalid_params(f"{control.id} cannot be {value}: {exc}") from None
        return self.controls(session.agent)

    async def set_config_option(self, rid: Any, params: msgspec.Raw | None) -> Any:
        self._offers_controls("session/set_config_option")
        p = decode_params(params, wire.SetConfigOptionParams)
        if p.type == "boolean" and isinstance(p.value, bool):  # a toggle: on or off
            controls = self._set(p.session_id, lambda c: c.id == p.config_id and c.boolean, "on" if p.value else "off",
                                 f"{shown(p.config_id)} (a boolean)")
            return wire.SetConfigOptionResult(config_options=config_options(controls, self.booleans()))
        if p.type not in (None, "value_id") or not isinstance(p.value, str):
            raise invalid_params(f"{p.config_id} takes one of its option values (a string)"
                                 + (", or type boolean with a boolean value" if p.type == "boolean" else ""))
        controls = self._set(p.session_id, lambda c: c.id == p.config_id, p.value, shown(p.config_id))
        return wire.SetConfigOptionResult(config_options=config_options(controls, self.booleans()))

    async def set_mode(self, rid: Any, params: msgspec.Raw | None) -> Any:
        self._offers_controls("session/set_mode")
        p = decode_params(params, wire.SetModeParams)
        self._set(p.session_id, lambda c: c.category == "mode", p.mode_id, "a mode")
        return {}

    # ------------------------------------------------------------------ slash commands

    async def run_command(self, session: Session, slot: Slot, content: list[Any]) -> wire.PromptResult | list[Any]:
        """A prompt that starts with ``/name``: the command's answer (a settled prompt), or the
        content to submit instead (``CommandResult.prompt``). Anything else comes back as it was."""
        first = content[0] if content else None
        match = COMMAND.match(first.text) if isinstance(first, TextBlock) else None
        commands = self.commands(session.agent) if match else []
        if match is None or not commands:
            return content
        assert isinstance(first, TextBlock)
        name, rest = match.group(1), first.text[match.end():]
        slot.typed = first.text
        command = next((c for c in commands if c.name == name), None)
        if command is None:
            # a Markdown list: an editor renders the answer as Markdown, where single newlines fold
            listed = "\n".join(f"- `/{c.name}`{' *' + one_line(c.hint, 100) + '*' if c.hint else ''} — "
                               f"{one_line(c.description, 200)}" for c in commands)
            return self._answer(session, slot, f"/{name} is not a command here. Commands:\n\n{listed}")
        try:
            with slot.admission:  # cancelling the prompt cancels the command
                result = await command.run(session.agent, rest.strip())
        except ValueError as exc:
            return self._answer(session, slot, f"/{name}: {exc}")
        except Exception as exc:  # a plugin's bug: said to the person, logged, the session goes on
            log.warning(f"/{name} failed: {exc!r}")
            return self._answer(session, slot, f"/{name} failed: {exc}")
        if slot.admission.cancelled_caught or slot.cancelled:
            return wire.PromptResult(stop_reason="cancelled")
        slot.admission = anyio.CancelScope()  # the rest of the admission (saving images) in a scope of its own
        if result.prompt is not None:
            return [TextBlock(text=result.prompt), *content[1:]]
        return self._answer(session, slot, result.reply or f"/{name}: done")

    def _answer(self, session: Session, slot: Slot, text: str) -> wire.PromptResult:
        message_id = new_id("msg_")
        if slot.typed is not None:  # for session/load: the command as typed, and its answer
            session.agent.emit(Note(kind=COMMAND_ANSWERED, data={"text": slot.typed, "typedId": new_id("msg_"),
                                                                 "reply": text, "messageId": message_id}))
        session.delivery.push(TextBlock(text=text), message_id)
        return wire.PromptResult(stop_reason="end_turn")



