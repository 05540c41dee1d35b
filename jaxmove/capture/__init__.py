"""Capture: a zoo preset, an HLO file, ``module:function``, a Workload or a jax object -> ``Program``."""

from .program import (CaptureError, EntryParameter, Program, capture, keystr_to_path,  # noqa: F401
                      program_from_hlo_file)
from .resolve import (NestingTooDeepError, TargetError, UserCodeError, load_target,  # noqa: F401
                      resolve_program)
from .workload import ROLES, Workload, role_from_name  # noqa: F401
