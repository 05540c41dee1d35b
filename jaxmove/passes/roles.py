"""Roles: which tensor role (weights, kv_cache, activations, unknown) each buffer holds.

Roles start at the ENTRY parameters — from the captured Flax/pytree information, or,
for an HLO file, from the parameter's name and ``op_name`` metadata (``role_from_name``)
— and flow to the buffers derived from them by ops that only move or re-type data:
bitcast, copy, convert, reshape, transpose, tuple / get-tuple-element, while-loop
carries, call/conditional parameters, slicing (slice, dynamic-slice, gather), the
buffer of a dynamic-update-slice, all-gather / collective-permute (a sharded weight
gathered for use is still a weight), and fusions whose root is such a chain from one
of their parameters. Everything a program computes is ``activations``.

An entry parameter whose role cannot be told is ``unknown``, never a guess.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence

from ..hlo import Computation, Instruction, Module, Shape
from ..hlo.opcodes import OPCODES, custom_call_targets, names
from ..vocab import ROLES, role_from_name  # noqa: F401  (ROLES re-exported)

# Opcodes whose result holds operand 0's role (kernel level / inside fusions), and custom-call
# targets that do the same: the opcode table (hlo/opcodes.py).
PASSTHROUGH = names(roles_pass=True)
_FUSED_PASSTHROUGH = names(fused_roles_pass=True)
_CC_PASSTHROUGH = custom_call_targets(roles_pass=True)

def entry_parameter_name(instr: Instruction) -> str:
    """The pytree path JAX recorded for an entry parameter (``op_name`` metadata), else its name."""
    md = instr.metadata
    return md.op_name if md is not None and md.op_name else instr.name


def _nleaves(shape: Shape) -> int:
    return shape.num_leaves


def leaf_position(shape: Shape, index: tuple[int, ...]) -> int:
    """Flat leaf number of ShapeIndex ``index`` within ``shape`` (O(len(index)))."""
    pos = 0
    s = shape
    for i in index:
        pos += s.leaf_offsets[i]
        s = s.tuple_shapes[i]
    return pos


class RoleMap(dict):
    """(computation, instruction) -> role of each leaf of the instruction's value.

    ``aliased``: the (computation, instruction) pairs whose value becomes (part of) an
    output that XLA aliases to a weights or kv_cache parameter — the buffers that hold
    the updated state, as opposed to copies made to read it.
    """

    aliased: frozenset = frozenset()
    #: (computation, instruction) -> its roles without the output roles (``roles_pass``'s
    #: ``output_roles``), for the values whose roles those changed: a prefill's new cache is
    #: ``kv_cache`` from its output role alone, not a cache the program updates (read-only).
    output_seeded: dict = {}


class _RolePropagation:
    def __init__(self, module: Module, seeds: dict[tuple[str, str], dict[int, str]] | None = None):
        self.module = module
        self.roles: RoleMap = RoleMap()
        self.done: set[str] = set()
        self.seeds = seeds or {}
        # fused computation class -> [(the parameter its root leaf traces to, the leaf's leaf
        # count)]: the same for every structurally identical copy (hlo/structure.py)
        self._fused_leaves: dict[str, list[tuple[int | None, int]]] = {}

    def of(self, comp: Computation, name: str) -> tuple[str, ...]:
        return self.roles[(comp.name, name)]

    def run(self, comp: Computation, params: dict[int, tuple[str, ...]]) -> tuple[str, ...]:
        """Roles of every instruction of ``comp`` and of the computations it calls; returns its
        root's. Iterative: each callee's walk is a frame on an explicit stack (a generator that
        yields the callee it needs and receives its root roles), so call chains of any depth
        are walked without Python recursion."""
        stack = [self._run(comp, params)]
        result = None
        while stack:
            try:
                request = stack[-1].send(result)
            except StopIteration as stop:
                stack.pop()
                result = stop.value
                continue
            result = None
            stack.append(self._run(*request))
        return result

    def _run(self, comp: Computation, params: dict[int, tuple[str, ...]]):
        cname = comp.name
        if cname in self.done:
            return self.roles[(cname, comp.root.name)]
        self.done.add(cname)
        seeds = self.seeds
        roles = self.roles
        routed = _ROUTED
        for instr in comp.instructions:
            if instr.opcode in _CALLERS:
                r = yield from self._caller_roles(comp, instr, params)
            elif instr.opcode in routed:
                r = self.instr_roles(comp, instr, params)
            else:  # computes a new value: what instr_roles answers, without its lookups
                r = _activations(instr.shape.num_leaves)
            if seeds:
                seed = seeds.get((cname, instr.name))
                if seed:  # a buffer that becomes an aliased output: its role wins over "activations"
                    r = tuple(seed.get(i, x) if x == "activations" else x for i, x in enumerate(r))
            roles[(cname, instr.name)] = r
        return roles[(cname, comp.root.name)]

    def instr_roles(self, comp: Computation, instr: Instruction,
                    params: dict[int, tuple[str, ...]]) -> tuple[str, ...]:
        n = _nleaves(instr.shape)
        op = instr.opcode
        roles, cname = self.roles, comp.name
        if op == "fusion":  # reads the roles of the operands its root traces to, only
            return self.fusion_roles(comp, instr)
        if op == "parameter":
            r = params.get(instr.parameter_number)
            return r if r is not None and len(r) == n else ("activations",) * n
        if op == "get-tuple-element":  # (its one operand's roles, without the list below)
            o = instr.operands[0]
            start = leaf_position(comp.by_name[o].shape, (instr.tuple_index,))
            return roles[(cname, o)][start:start + n]
        ops = [roles[(cname, o)] for o in instr.operands]
        if op == "tuple":
            return tuple(x for r in ops for x in r)
        if op in _CALLERS:  # (run walks these itself; this answers for a lone instruction)
            return self.run_caller(comp, instr, params)
        if op in _PER_OPERAND and len(ops) > 1:  # a combined collective: result i is operand i's
            r = _per_operand(instr.shape, ops)
            if r is not None:
                return r
        if op in _STARTS:
            r = _start_roles(instr.shape, ops, None)
            if r is not None:
                return r
        if op in _DONES and ops:
            r = _done_roles(comp.by_name[instr.operands[0]], ops[0], n, op.endswith("-update"))
            if r is not None:
                return r
        if op in PASSTHROUGH or (op == "custom-call" and instr.custom_call_target in _CC_PASSTHROUGH):
            if ops and len(ops[0]) == n:
                return ops[0]
            if ops and ops[0]:
                return (ops[0][0],) * n
        return ("activations",) * n

    def run_caller(self, comp: Computation, instr: Instruction,
                   params: dict[int, tuple[str, ...]]) -> tuple[str, ...]:
        """Roles of a while / call / conditional / async-start, walking its callees."""
        gen = self._caller_roles(comp, instr, params)
        result = None
        while True:
            try:
                request = gen.send(result)
            except StopIteration as stop:
                return stop.value
            result = self.run(*request)

    def _caller_roles(self, comp: Computation, instr: Instruction,
                      params: dict[int, tuple[str, ...]]):
        """Generator: yields (callee, its parameter roles) for each callee to walk, receives the
        callee's root roles, returns the instruction's roles."""
        n = _nleaves(instr.shape)
        op = instr.opcode
        roles, cname = self.roles, comp.name
        ops = [roles[(cname, o)] for o in instr.operands]
        comps = self.module.computations
        if op == "while":
            init = ops[0]
            body = comps[instr.attrs["body"].strip().lstrip("%")]
            cond = comps[instr.attrs["condition"].strip().lstrip("%")]
            root = yield body, {0: init}
            carry = _carry_roles(init, root)
            if carry != init:  # a carry the body recomputes: walk the body again with its roles
                self._forget(body)
                yield body, {0: carry}
            yield cond, {0: carry}
            return carry if len(carry) == n else ("activations",) * n
        if op in ("call", "conditional"):
            outs = []
            for b, callee in enumerate(instr.called_computations):
                if op == "call":
                    p = {i: r for i, r in enumerate(ops)}
                else:
                    p = {0: ops[b + 1]} if b + 1 < len(ops) else {}
                outs.append((yield comps[callee], p))
            if outs and all(o == outs[0] for o in outs) and len(outs[0]) == n:
                return outs[0]
            return ("activations",) * n
        wrapped = None
        for callee in instr.called_computations:  # async-start: ((operands...), result, context...)
            wrapped = yield comps[callee], {i: r for i, r in enumerate(ops)}
        r = _start_roles(instr.shape, ops, wrapped) if wrapped is not None else None
        return r if r is not None else ("activations",) * n

    def _forget(self, comp: Computation) -> None:
        """Mark ``comp`` and the computations it calls (transitively) as not yet walked."""
        stack, comps = [comp.name], self.module.computations
        while stack:
            name = stack.pop()
            if name in self.done:
                self.done.discard(name)
                for instr in comps[name].instructions:
                    stack.extend(c for c in instr.called_computations if c in self.done)

    def fusion_roles(self, comp: Computation, instr: Instruction) -> tuple[str, ...]:
        module = self.module
        name = instr.called_computations[0]
        cls = module.structural_classes[name]
        traced = self._fused_leaves.get(cls)
        if traced is None:
            fused = module.computations[name]
            root = fused.root
            leaves = [fused.by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]
            traced = self._fused_leaves[cls] = [
                (_trace_to_parameter(module, fused, leaf), _nleaves(leaf.shape)) for leaf in leaves]
        roles, cname, operands = self.roles, comp.name, instr.operands
        out: list[str] = []
        for k, n_leaf in traced:
            r = roles[(cname, operands[k])] if k is not None and k < len(operands) else None
            role = r[0] if r else "activations"
            out.extend([role] * n_leaf)
        n = _nleaves(instr.shape)
        return tuple(out) if len(out) == n else _activations(n)


# Instructions whose callees run as kernels of their own: walked by _RolePropagation.run.
_CALLERS = frozenset({"while", "call", "conditional", "async-start", "call-start"})
# Data-moving collectives that take several operands (XLA's combiners: one all-gather /
# collective-permute for many arrays): result element i holds operand i's role.
_PER_OPERAND = frozenset(o for o in PASSTHROUGH if OPCODES[o].collective is not None)
# Async starts of data moves (native ``all-gather-start`` / ``collective-permute-start``, the
# ``X-start`` sugar of XLA's async wrapper): shape ``(operand(s), result(s), context...)``.
_STARTS = frozenset(o for o in PASSTHROUGH if OPCODES[o].async_part == "start" and o != "copy-start")
# Their dones (and the generic async-done / async-update): the start's result element.
_DONES = frozenset(o for o in PASSTHROUGH if OPCODES[o].async_part in ("done", "update")
                   and o != "copy-done") | {"async-done", "async-update", "call-done", "call-update"}


def _carry_roles(init: tuple[str, ...], root: tuple[str, ...] | None) -> tuple[str, ...]:
    """Roles of a while loop's carried leaves: the init's role where the body passes the leaf
    through (a weight, or a cache updated in place, keeps its role), ``activations`` where the
    body computes a new value of it (e.g. the hidden state of a scanned decode, whose init is
    the embedding lookup: the state is an activation from the first iteration on). An
    ``unknown`` init stays ``unknown`` (its first iteration reads the untold parameter); a
    carry that becomes an aliased weights / KV output gets its role from the alias seeds."""
    if root is None or len(root) != len(init) or root == init:
        return init
    return tuple(i if i == r or i == "unknown" else "activations" for i, r in zip(init, root))


def _per_operand(shape: Shape, ops: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    """Roles of a tuple whose element i is (the result of) operand i, or None when the
    shape is not one element per operand."""
    if not shape.is_tuple or len(shape.tuple_shapes) != len(ops):
        return None
    out: list[str] = []
    for el, r in zip(shape.tuple_shapes, ops):
        out.extend([r[0] if r else "activations"] * el.num_leaves)
    return tuple(out)


def _start_roles(shape: Shape, ops: list[tuple[str, ...]],
                 wrapped: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Roles of an async start ``(operand(s), result(s), context...)``: element 0 holds the
    operands (one array, or a tuple of one per operand), element 1 the result(s): the wrapped
    computation's root roles when given (``async-start``), else one result per operand (a
    combined ``all-gather-start``) or operand 0's role (``slice-start``, ``copy``-like moves);
    context elements (sync flags, scratch) are activations. None: not that shape."""
    if not shape.is_tuple or len(shape.tuple_shapes) < 2 or not ops:
        return None
    first, result = shape.tuple_shapes[0], shape.tuple_shapes[1]
    flat = tuple(x for r in ops for x in r)
    if first.num_leaves == len(flat):
        head = flat
    elif not first.is_tuple and ops[0]:
        head = (ops[0][0],)
    else:
        return None
    if wrapped is not None:
        if len(wrapped) != result.num_leaves:
            return None
        body = tuple(wrapped)
    else:
        body = _per_operand(result, ops) if len(ops) > 1 else None
        if body is None:
            body = (ops[0][0] if ops[0] else "activations",) * result.num_leaves
    rest = sum(s.num_leaves for s in shape.tuple_shapes[2:])
    return head + body + _activations(rest)


def _done_roles(start: Instruction, start_roles: tuple[str, ...], n: int,
                update: bool) -> tuple[str, ...] | None:
    """Roles of a ``*-done`` / ``*-update``: the start's result element (element 1 of a
    start shaped ``(operand(s), result(s), context...)``), or the start's own roles when the
    done has its shape (``all-reduce-start``, an update). None: neither."""
    shape = start.shape
    if update and len(start_roles) == n:  # an update has its start's shape
        return start_roles
    if shape.is_tuple and len(shape.tuple_shapes) >= 2 and shape.tuple_shapes[1].num_leaves == n:
        off = shape.leaf_offsets[1]
        r = start_roles[off:off + n]
        if len(r) == n:
            return r
    if len(start_roles) == n:
        return start_roles
    return None
# Opcodes whose roles instr_roles derives from operands, parameters or callees; every other
# opcode computes a new value: all leaves "activations".
_ROUTED = PASSTHROUGH | {"parameter", "tuple", "get-tuple-element", "while", "call", "conditional",
                         "async-start", "async-update", "async-done", "call-start", "call-update", "call-done",
                         "fusion", "custom-call"}
_ACTIVATIONS: dict[int, tuple[str, ...]] = {}


def _activations(n: int) -> tuple[str, ...]:
    """("activations",) * n, shared (tuples are immutable)."""
    r = _ACTIVATIONS.get(n)
    if r is None:
        r = ("activations",) * n
        if n <= 64:
            _ACTIVATIONS[n] = r
    return r


def _trace_to_parameter(module: Module, comp: Computation, instr: Instruction) -> int | None:
    """Parameter number that ``instr`` is a data-moving chain of, inside a fused computation.

    Iterative (nested fusions any number of levels deep): ``outer`` holds the enclosing
    (computation, fusion instruction) pairs whose traced parameter is still pending.
    """
    outer: list[tuple[Computation, Instruction]] = []
    seen = 0
    while seen < 1_000_000:  # bounds the walk of a malformed (cyclic) chain
        seen += 1
        if instr.opcode == "parameter":
            k = instr.parameter_number
            if not outer:
                return k
            comp, fusion = outer.pop()
            if k is None or k >= len(fusion.operands):
                return None
            instr = comp.by_name[fusion.operands[k]]
            continue
        if instr.opcode in _FUSED_PASSTHROUGH or (
                instr.opcode == "custom-call" and instr.custom_call_target in _CC_PASSTHROUGH
                and instr.operands):  # e.g. XLA:TPU's AsyncCollectiveStart(all-gather(param))
            instr = comp.by_name[instr.operands[0]]
            continue
        if instr.opcode == "fusion":
            outer.append((comp, instr))
            comp = module.computations[instr.called_computations[0]]
            instr = comp.root
            continue
        return None
    return None


# role_from_name's rules (vocab.py) are blind to which digits a name has: no token has a digit,
# and a component's being all digits survives a digit run written as one 0. So names that differ
# only in their numbers (p0 ... p24999, layers_0 ... layers_31) are asked once.
_DIGITS = re.compile(r"[0-9]+")


def roles_pass(module: Module, entry_roles: dict[int, str] | None = None,
               kernel_computations: set[str] | None = None,
               output_roles: Sequence[str | None] | None = None) -> RoleMap:
    """(computation name, instruction name) -> role of each leaf of the instruction's value.

    Args:
      module: the HLO module.
      entry_roles: ENTRY parameter number -> role, from capture. When None, roles come
        from parameter names and metadata (``role_from_name``).
      output_roles: one role (or None) per leaf of the ENTRY root, from capture
        (``Program.output_roles``): an output given ``weights``, ``kv_cache`` or
        ``optimizer_state`` gives that role to the values it is made of, as an output aliased
        to such a parameter does (``_alias_seeds``); e.g. the KV cache a prefill returns is
        written as ``kv_cache``. Ignored when its length is not the root's leaf count.
    Returns a map covering every instruction of every kernel-level computation.
    """
    entry_params: dict[int, tuple[str, ...]] = {}
    by_name: dict[str, str] = {}  # name with its digit runs as one 0 -> role (_DIGITS)
    for p in module.entry.parameters:
        if entry_roles is not None and p.parameter_number in entry_roles:
            role = entry_roles[p.parameter_number]
        else:
            name = entry_parameter_name(p)
            key = _DIGITS.sub("0", name)
            role = by_name.get(key)
            if role is None:
                role = by_name[key] = role_from_name(name)
        entry_params[p.parameter_number] = (role,) * _nleaves(p.shape)
    prop = _RolePropagation(module)
    prop.run(module.entry, entry_params)
    aliased = _alias_seeds(module, entry_params)
    if aliased:
        prop = _RolePropagation(module, aliased)
        prop.run(module.entry, entry_params)
        prop.roles.aliased = frozenset(aliased)
    roles = prop.roles
    if output_roles and any(r in _STATE_ROLES for r in output_roles):
        seeds = _alias_seeds(module, entry_params, output_roles)
        if seeds != aliased:
            prop = _RolePropagation(module, seeds)
            prop.run(module.entry, entry_params)
            seeded = prop.roles
            seeded.aliased = frozenset(aliased)
            seeded.output_seeded = {k: roles.get(k) for k, v in seeded.items() if roles.get(k) != v}
            roles = seeded
    return roles


_BACK_THROUGH = names(roles_back=True)


def _leaf_index(shape: Shape, pos: int) -> tuple[int, ...]:
    """The ShapeIndex of flat leaf ``pos`` of ``shape`` (``leaf_position``'s inverse)."""
    idx: list[int] = []
    s = shape
    while s.is_tuple:
        i = bisect_right(s.leaf_offsets, pos) - 1  # (the last element starting at or before pos)
        idx.append(i)
        pos -= s.leaf_offsets[i]
        s = s.tuple_shapes[i]
    return tuple(idx)


_STATE_ROLES = ("kv_cache", "weights", "optimizer_state")


def _alias_seeds(module: Module, entry_params: dict[int, tuple[str, ...]],
                 output_roles: Sequence[str | None] | None = None
                 ) -> dict[tuple[str, str], dict[int, str]]:
    """Buffers that end up in an output aliased to a weights or kv_cache parameter
    (``input_output_alias``: the donated buffer is updated and returned), or in an output
    ``output_roles`` gives such a role (``roles_pass``).

    A decode step that rebuilds its cache — e.g. a scan whose stacked outputs start as a
    zero broadcast and are filled slice by slice — writes a new KV cache, not activations.
    Walks back from each aliased output leaf through tuple / get-tuple-element, data moves,
    the buffer of dynamic-update-slice, while carries (init, body root and parameter),
    and fusions whose root is such a chain from one of their parameters.
    """
    seeds: dict[tuple[str, str], dict[int, str]] = {}
    seen: set[tuple[str, str, tuple[int, ...]]] = set()
    comps = module.computations

    def mark(comp: Computation, instr: Instruction, idx: tuple[int, ...], role: str) -> None:
        stack = [(comp, instr, idx)]
        while stack:
            comp, instr, idx = stack.pop()
            key = (comp.name, instr.name, idx)
            if key in seen:
                continue
            seen.add(key)
            try:
                pos = leaf_position(instr.shape, idx) if instr.shape.is_tuple else 0
            except (IndexError, AttributeError):
                continue
            seeds.setdefault((comp.name, instr.name), {})[pos] = role
            op = instr.opcode
            if op == "tuple" and idx:
                stack.append((comp, comp.by_name[instr.operands[idx[0]]], idx[1:]))
            elif op == "get-tuple-element":
                stack.append((comp, comp.by_name[instr.operands[0]], (instr.tuple_index,) + idx))
            elif op == "optimization-barrier":
                stack.append((comp, comp.by_name[instr.operands[0]], idx))
            elif op in _BACK_THROUGH and instr.operands:
                stack.append((comp, comp.by_name[instr.operands[0]], idx))
            elif op == "while":
                body = comps[instr.attrs["body"].strip().lstrip("%")]
                stack.append((comp, comp.by_name[instr.operands[0]], idx))
                stack.append((body, body.root, idx))
                if body.parameters:
                    stack.append((body, body.parameters[0], idx))
            elif op == "fusion" and instr.called_computations:
                fused = comps[instr.called_computations[0]]
                root = fused.root
                leaf = fused.by_name[root.operands[idx[0]]] if root.opcode == "tuple" and idx else root
                k = _trace_to_parameter(module, fused, leaf)
                if k is not None and k < len(instr.operands):
                    stack.append((comp, comp.by_name[instr.operands[k]], ()))

    entry = module.entry
    for pnum, pairs in module.input_output_alias.items():
        role = entry_params.get(pnum, ("unknown",))[0]
        if role not in _STATE_ROLES:
            continue
        for out_idx, _param_idx in pairs:
            mark(entry, entry.root, tuple(out_idx), role)
    rshape = entry.root.shape
    if output_roles and len(output_roles) == rshape.num_leaves:
        for j, role in enumerate(output_roles):
            if role in _STATE_ROLES:
                mark(entry, entry.root, _leaf_index(rshape, j), role)
    return seeds
