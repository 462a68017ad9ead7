"""How ``--help`` names parameters: as command-line tools do, not as Python types.

Typer 0.29 shows each parameter's Python type in the help (``--no-wait <bool>``, ``--lsn <str>``,
``{dst}`` in the usage line, ``--help <bool>``). Here a flag takes no value and shows none, an option's
value and an argument show their NAME in capitals (``--lsn LSN``, ``{DST}``, ``[TABLES]...``), and what the
code spelled out (``--max-wait SECONDS``) or a choice (``table|csv|json``) stays as it is. The
commands and groups of the command line are made with :class:`PlainCommand` and :class:`PlainGroup`.
"""

from __future__ import annotations

from typing import Any

import click
from typer.core import TyperCommand, TyperGroup

__all__ = ["PlainCommand", "PlainGroup", "plain_metavar"]


def plain_metavar(param: click.Parameter) -> None:
    """Give ``param`` the metavar its help shows (module docstring), unless it has one."""
    if getattr(param, "metavar", None) is not None:
        return
    desc = getattr(param, "type_descriptor", None)  # Typer's parameters (typer.core) describe their type so
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""  # a flag takes no value
    elif (desc is not None and desc.is_choice) or isinstance(getattr(param, "type", None), click.Choice):
        return  # the choices say more than a name
    else:  # an option by its long name (--format: FORMAT), an argument by its own (Typer adds "...")
        long = next((o for o in getattr(param, "opts", ()) if o.startswith("--")), None)
        name = long[2:] if long else param.name
        if name:
            param.metavar = name.upper().replace("-", "_")


class _PlainParams:
    """What :class:`PlainCommand` and :class:`PlainGroup` add to Typer's: their parameters named plainly
    (:func:`plain_metavar`) when made, and the ``--help`` option, made later by ``get_params``."""

    params: list[click.Parameter]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            plain_metavar(p)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params: list[click.Parameter] = super().get_params(ctx)  # type: ignore[misc]  # the Typer class after this one
        for p in params:
            plain_metavar(p)
        return params


class PlainCommand(_PlainParams, TyperCommand):
    """A command whose help names its parameters plainly (:func:`plain_metavar`)."""


class PlainGroup(_PlainParams, TyperGroup):
    """A group (``mooncake``, ``mooncake pg``) whose own options are named plainly (:func:`plain_metavar`)."""
