"""Measure programs on the local device and join the timings to their instructions.

``measure(target)`` -> ``Measurement`` (``run.py``): wall times of N runs and, from a
``jax.profiler`` trace (``profile.py``), the measured time of every HLO instruction per
program run, with the fraction of measured device time the join covered.
"""

from .profile import InstructionTiming, ProfileError, ProfileJoin, TraceEvent, join_events
from .run import Measurement, Prepared, measure, prepare, random_like

__all__ = ["InstructionTiming", "Measurement", "Prepared", "ProfileError", "ProfileJoin",
           "TraceEvent", "join_events", "measure", "prepare", "random_like"]
