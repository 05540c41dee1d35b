"""Excess movement: what a program moves beyond the compulsory minimum, why, and the fix.

Built like the other passes, one job per module:

* ``compulsory.py`` -- the compulsory-traffic model (DESIGN.md, "Compulsory and excess": each
  input's needed footprint read once, each result written once, in-place updates write the
  update, intermediates that fit on chip cost nothing, collectives at the data's width) and
  the accounting that splits every access of every kernel into compulsory bytes and excess;
* ``ledger.py`` -- the sums and the identity ``compiled = compulsory + causes + unattributed``
  per role and per path, and the ExcessAnalysis built from them;
* ``causes.py`` -- the rule table: one rule per cause (``CAUSE_KINDS``) with what it matches,
  how its bytes are counted, how it takes part in the accounting, and its fix text;
* ``kernels.py`` -- the kernel causes' matchers (rematerialization, host round trips, split-K,
  a dot as multiply + reduce, copy kernels); ``lookups.py`` -- table lookups (embeddings:
  the rows a gather or one-hot dot touches); ``buffers.py`` -- which values share a buffer;
  ``wire.py`` -- tiling re-reads and collectives' excess; ``records.py`` -- the results.

``excess_pass`` is a pure function of (analysis, entry parameters, spec, reuse); passes never
print.
"""

from __future__ import annotations

from ..._perf import gc_paused
from .causes import CAUSE_KINDS, CAUSES, UNATTRIBUTED, CauseRule
from .compulsory import Accounting
from .ledger import MAX_LISTED
from .records import CauseInstruction, ExcessAnalysis, ExcessCause, ExcessLine

__all__ = ["CAUSE_KINDS", "CAUSES", "UNATTRIBUTED", "MAX_LISTED", "CauseRule", "CauseInstruction",
           "ExcessAnalysis", "ExcessCause", "ExcessLine", "excess_pass"]


@gc_paused
def excess_pass(analysis, parameters=(), spec=None, reuse=None, roles=None) -> ExcessAnalysis:
    """Compulsory traffic and excess of ``analysis`` (a ModuleAnalysis, passes/analysis.py).

    Args:
      parameters: the program's ``EntryParameter`` s (capture; empty for HLO dumps: roles and
        names then come from the HLO, donation from ``input_output_alias``).
      spec: a HardwareSpec for the on-chip capacity and the time of each cause, or None.
      reuse: the ReuseAnalysis computed with ``spec`` (tiling re-reads), or None.
      roles: the roles pass's RoleMap (recomputed from ``parameters`` when None).
    Returns:
      An ExcessAnalysis (``compulsory.py``'s docstring); its figures are per program run.
    """
    return Accounting(analysis, tuple(parameters or ()), spec, reuse, roles).run()
