"""jaxmove: where do the bytes of a compiled JAX/XLA program go?

>>> import jaxmove
>>> report = jaxmove.analyze("gpt-tiny-decode")
>>> report.totals.kv_cache_read_bytes
"""

from ._cli_start import guard_import as _guard_import
from ._platform import import_jax_quietly as _import_jax_quietly

with _guard_import():  # the jaxmove command: a Ctrl-C / SIGTERM while jax imports is one line
    _import_jax_quietly()

    from .api import analyze, compare
    from .capture import Program, TargetError, Workload, resolve_program
    from .errors import JaxmoveInputError
    from .hlo import HloParseError, parse_file, parse_module
    from .report.report import Report
    from . import sweep  # callable: jaxmove.sweep("SWEEP.toml", ...) (jaxmove/sweep/__init__.py)

__all__ = ["analyze", "compare", "sweep", "resolve_program", "Program", "Workload", "Report", "TargetError",
           "JaxmoveInputError", "HloParseError", "parse_file", "parse_module"]
__version__ = "0.1.0"
