"""The ``jaxmove`` command line: one module per command; each parses, calls the Python API, renders.

Exit status: 0 success, 2 bad input (missing or malformed file, unknown target, bad
``--set``), with one line on stderr naming file:line:col and what was expected.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..hlo import HloParseError
from .common import _Parser, check_outputs, parse_sets, positive_int  # noqa: F401  (re-exported)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="jaxmove",
        description="Where do the bytes of a compiled JAX/XLA program go? Per-instruction HBM "
                    "traffic by path and tensor role, from a Flax model or an HLO dump.")
    sub = p.add_subparsers(dest="command", required=True)

    from .analyze import add_analyze_command
    from .annotate import add_annotate_command
    from .zoo import add_models_command
    add_analyze_command(sub)
    add_annotate_command(sub)
    add_models_command(sub)
    from .hardware import add_hardware_commands
    add_hardware_commands(sub)
    from .compare import add_compare_command
    add_compare_command(sub)
    from .plans import add_plans_command
    add_plans_command(sub)
    from .sweep import add_sweep_command
    add_sweep_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for attr in ("html", "trace", "output", "save_fit"):  # an empty path would be skipped silently
        value = getattr(args, attr, None)
        if isinstance(value, str) and not value.strip():
            print(f"jaxmove: error: --{attr.replace('_', '-')} needs a file path, got {value!r}",
                  file=sys.stderr)
            return 2
    from ..errors import JaxmoveInputError

    try:
        return args.func(args)
    except HloParseError as e:
        print(f"jaxmove: error: {e}", file=sys.stderr)
    except FileNotFoundError as e:
        if e.filename:
            msg = f"{e.filename}: no such file"
        else:  # raised with a message of ours, which already says it (capture/resolve.py)
            msg = str(e) if "no such file" in str(e) else f"{e}: no such file"
        print(f"jaxmove: error: {msg}", file=sys.stderr)
    except IsADirectoryError as e:
        print(f"jaxmove: error: {e.filename}: is a directory, expected an HLO text file", file=sys.stderr)
    except JaxmoveInputError as e:  # every input error; anything else is a bug (below)
        print(f"jaxmove: error: {e}", file=sys.stderr)
    except BrokenPipeError:  # e.g. `jaxmove analyze ... | head`
        return 0
    except KeyboardInterrupt:
        print("jaxmove: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours, not bad input: one line, exit 1, traceback on request
        if os.environ.get("JAXMOVE_DEBUG"):
            raise
        print(f"jaxmove: internal error: {type(e).__name__}: {e} (set JAXMOVE_DEBUG=1 for the "
              "traceback, and please report it)", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
