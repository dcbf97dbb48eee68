"""dsh plugin ``deepseek-model``: the ``deepseek`` model provider.

Hooks only decide; the provider object (``DeepSeekProvider``) does the I/O. Configuration
comes from ``[config.deepseek-model]`` (see README.md); the API key from
``DEEPSEEK_API_KEY`` (environment, else ``.env``) and is looked up per request, so a
missing key fails the request, not start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dsh_core import config_type_hook, hookimpl

from ._catalogue import CATALOGUE, ModelCard
from ._config import PLUGIN, DeepSeekConfig, Settings, parse_settings
from ._provider import PROVIDER, DeepSeekProvider

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host, ModelProvider

__all__ = ["CATALOGUE", "PLUGIN", "PROVIDER", "DeepSeekProvider", "ModelCard", "Settings", "parse_settings"]

@dataclass
class HostSettings:
    """The validated settings of one host (its state slot), from dsh_configure to dsh_register_models."""

    settings: DeepSeekConfig = field(default_factory=DeepSeekConfig)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    host.state(HostSettings).settings = host.config_for(DeepSeekConfig)


dsh_config_type = config_type_hook(PLUGIN, DeepSeekConfig)


@hookimpl
def dsh_register_models(register: Callable[[ModelProvider], None], host: Host) -> None:
    register(DeepSeekProvider(host.state(HostSettings).settings, host=host))


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    provider = host.models.get(PROVIDER)
    if not isinstance(provider, DeepSeekProvider):
        return None

    @asynccontextmanager
    async def pooled_client() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await provider.aclose()

    return pooled_client()


def _setup_auth(p: Any) -> None:
    sub = p.add_subparsers(dest="auth_command", metavar="ACTION", required=True)
    login = sub.add_parser("login", help="store your DeepSeek API key (read without echo) in the OS keyring",
                           description="Read the key without echo, check it against DeepSeek (GET /models), store it "
                                       "in the OS keyring, or else in a 0600 file in your config directory.")
    login.add_argument("--stdin", action="store_true", help="read the key from standard input (scripts)")
    login.add_argument("--no-check", action="store_true", help="store the key without asking DeepSeek first")
    sub.add_parser("logout", help="remove the stored key")
    sub.add_parser("status", help="say where a key is found (never the key)")


def _auth(args: Any) -> int:
    from . import _login

    if args.auth_command == "login":
        return _login.login(stdin=args.stdin, check=not args.no_check)
    if args.auth_command == "logout":
        return _login.logout()
    return _login.status()


@hookimpl
def dsh_register_commands(commands: Any) -> None:
    commands.add("auth", help="log in to DeepSeek: store, remove or locate your API key (login, logout, status)",
                 description="Keep your DeepSeek API key in the OS keyring (or a file only you can read), so "
                             "editors and dsh run find it without DEEPSEEK_API_KEY. The key never goes to a log, "
                             "a frame or a process environment.",
                 setup=_setup_auth, run=_auth)


@hookimpl
def dsh_register_doctor_checks(register: Callable[[Any], None], host: Host) -> None:
    from ._doctor import key_check

    register(key_check(host))
