"""The spine's own defaults, registered like any plugin (all ``trylast``)."""

from . import commands, defaults

BUILTINS = [("dsh-defaults", defaults), ("dsh-commands", commands)]
