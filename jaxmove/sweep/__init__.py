"""Sweeps: a grid of models x ``--set`` values x targets x meshes x plans, each point compiled
and analysed in its own process, locally or on Ray; results ranked, fastest that fits first.

    >>> import jaxmove
    >>> result = jaxmove.sweep("SWEEP.toml", jobs=2, output="results.parquet")   # doctest: +SKIP
    >>> result.best, result.to_dataframe(), result.pareto_plot()                  # doctest: +SKIP

``jaxmove.sweep`` is this package and is callable: ``jaxmove.sweep(...)`` is
``jaxmove.sweep.run.sweep(...)``. Modules: ``spec`` (SWEEP.toml, points and their keys),
``point`` (one point -> a row), ``worker`` (a process per point), ``executors`` (local pool,
Ray), ``store`` (result file, resume), ``result`` (ranking, JSON, DataFrame), ``render``
(table, Pareto plot, HTML).
"""

from __future__ import annotations

import sys
import types

from .result import SweepResult, pareto_keys, rank_key
from .run import SweepError, sweep
from .spec import DEFAULT_TARGET, Point, SweepSpec, SweepSpecError, load_sweep, parse_sweep, point_key
from .store import ResultFileError

__all__ = ["sweep", "SweepResult", "SweepError", "SweepSpec", "SweepSpecError", "ResultFileError",
           "Point", "load_sweep", "parse_sweep", "point_key", "rank_key", "pareto_keys",
           "DEFAULT_TARGET"]


class _CallableModule(types.ModuleType):
    """Lets ``jaxmove.sweep(...)`` call the function while ``jaxmove.sweep.X`` stays the package."""

    def __call__(self, *args, **kwargs) -> SweepResult:
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
