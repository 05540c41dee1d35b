"""Compatibility alias: ``jaxmove.workload.Workload`` is ``jaxmove.capture.workload.Workload``."""

from .capture.workload import ROLES, Workload, role_from_name  # noqa: F401
