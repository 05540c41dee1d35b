"""``jaxmove models``: the zoo's presets."""

from __future__ import annotations

import argparse


def _cmd_models(args: argparse.Namespace) -> int:
    from jaxmove import zoo as models
    from rich.table import Table

    from ..report.render_helpers import make_console

    table = Table(title="jaxmove model zoo (use: jaxmove analyze NAME [--set key=value])")
    table.add_column("preset", style="bold")
    table.add_column("description")
    for name, desc in models.list_presets():
        table.add_row(name, desc)
    make_console().print(table)
    print(f"--set keys: {', '.join(models.OVERRIDE_KEYS)}")
    return 0


def add_models_command(sub) -> None:
    """Register ``jaxmove models``."""
    m = sub.add_parser("models", help="list the built-in model presets")
    m.set_defaults(func=_cmd_models)
