"""Measure programs on the local device and join the timings to their instructions.

``measure(target)`` -> ``Measurement`` (``run.py``): wall times of N runs and, from a
``jax.profiler`` trace (``profile.py``), the measured time of every HLO instruction per
program run, with the fraction of measured device time the join covered.

``compare_profile(path)`` (``profile_compare.py``) does the same for a profile captured
elsewhere: XProf xplanes, jax.profiler trace JSON, nsys-jax archives (``profiles.py``).
"""

from .profile import InstructionTiming, ProfileError, ProfileJoin, TraceEvent, join_events
from .run import Measurement, Prepared, measure, prepare, random_like
from .profile_compare import ProfileComparison, compare_profile
from .profiles import Capture, read_capture

__all__ = ["Capture", "InstructionTiming", "Measurement", "Prepared", "ProfileComparison", "ProfileError",
           "ProfileJoin", "TraceEvent", "compare_profile", "join_events", "measure", "prepare",
           "random_like", "read_capture"]
