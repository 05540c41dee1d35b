"""Time of one NCCL collective on NVIDIA GPUs: NCCL's own tuning model (algorithms, protocols,
latencies, bandwidths), the protocol and algorithm NCCL would pick, and a few fitted terms.

NCCL picks, for each call, the (algorithm, protocol) with the least modelled time
``latency + bytes / bandwidth`` (NVIDIA/nccl ``src/graph/tuning.cc``: ``ncclTopoTuneModel``
builds the tables, ``ncclTopoGetAlgoTime`` evaluates them). This module rebuilds those tables
for one NVLink (NVSwitch) node from the spec and NCCL's published constants, and adds what a
measurement of an XLA program sees on top (fitted, `NcclParams`)::

    time = overhead_s + latency_scale * lat[a, p] + bytes / (bandwidth_efficiency * bw[a, p])
           + local_bytes / (local_copy_efficiency * hbm_bytes_per_s)

* Algorithms (tuning.cc): all-reduce ring, tree and NVLS (NVSwitch multicast, compute
  capability >= 9.0); all-gather and reduce-scatter ring and NVLS; protocols LL, LL128 and
  Simple (NVLS: Simple only). ``(a, p)`` is the pair with the least NCCL time.
* Latency (us, tuning.cc ``baseLatencies`` + ``hwLatencies[NVLINK]``): ring ``base[p] +
  nsteps * hw[p]`` with ``nsteps`` = 2(n-1) for all-reduce, n-1 for all-gather /
  reduce-scatter; tree ``base[p] + 2 (n-1) hw[p]``; NVLS ``hw`` (25 us).
* Bandwidth (GB/s): the ring graph's ``nChannels x bwIntra`` (search.cc: the first speed of
  the architecture's speed array not above the GPU's NVLink bandwidth, as many channels as
  fit, then doubled (``ncclTopoDupChannels``)); the GPU's NVLink bandwidth as NCCL counts it is
  the spec's ``intra_node_bytes_per_s`` x NCCL's per-link figure / the link's signalling rate
  (topo.h ``SM80_NVLINK_BW`` 20.0, ``SM90_NVLINK_BW`` 20.6, ``SM100_NVLINK_BW`` 40.1 GB/s per
  link of 25 / 25 / 50 GB/s per direction: NVLink 3/4/5). Then tuning.cc's refinements: LL
  ``min(llMaxBw, busBw / 2)``, LL128 ``min(0.92 busBw, nChannels x perChMaxRingLL128Bw)``, tree
  ``min(0.92 busBw, nChannels x perChMaxTreeBw)`` (LL ``/3.8``, LL128 ``x 7/9``), NVLS
  ``busBw x nvlsEfficiency x (nCh-1)/nCh`` with ``nCh`` = the group's GPUs (``x 2`` for
  all-reduce, ``x (n-1)/n`` for all-gather / reduce-scatter); ring and NVLS all-reduce
  bandwidths are converted to algorithm bandwidth by ``n / nsteps``, tree by 1/2.
  ``bytes`` is NCCL's ``nBytes``: the buffer of all-reduce, the whole output of all-gather,
  the whole input of reduce-scatter.
* All-to-all and collective-permute are NCCL send/recv (XLA groups one ``ncclSend`` /
  ``ncclRecv`` per peer): not in tuning.cc's tables; `p2p_time_s` follows NCCL's p2p schedule
  (src/enqueue.cc ``scheduleP2pTasksToPlan`` / ``addP2pToPlan``, src/graph/paths.cc
  ``ncclTopoComputeP2pChannels``, src/include/device.h ``ncclP2pChannelForPart``): the
  communicator's p2p channels, each op's protocol (LL up to channels-per-peer x
  ``NCCL_P2P_LL_THRESHOLD``) and channel count (doubling while a part exceeds 32 steps of
  ``NCCL_P2P_NVL_CHUNKSIZE``), which channels each round uses (a round pairs the send to rank + r
  with the receive from rank - r), a fitted per-channel rate and the NVLink cap.
* ``local_bytes``: what NCCL's kernel copies inside the GPU's own memory besides the transfer
  (out-of-place all-gather copies its input into its slot of the output, 2 x input bytes;
  reduce-scatter reads its whole input and writes its share, input + output; all-reduce reads
  its input and writes its output, 2 x buffer); done by NCCL's CTAs, so below the HBM rate
  (``local_copy_efficiency``, fitted). All-to-all's own chunk is its round-0 send/recv.
* Across nodes (``spans_nodes``): the ring over the network (``inter_node_bytes_per_s``, one
  NIC per GPU) with tuning.cc's NET latencies; NVLS and tree are not modelled there.

Fitted (`FITTED`, by ``benchmarks/gpu_kernels.py`` on a random half of XLA's measured H100
table, ``../shared/data/xla_collectives_h100.csv``; the other half is the reported error):
``overhead_s`` (XLA's collective thunk and NCCL's kernel launch), ``latency_scale`` and
``hop_latency_scale`` (base and per-step latency), ``bandwidth_efficiency``,
``local_copy_efficiency``, and for send/recv ``p2p_channel_bytes_per_s``, ``p2p_duplex``,
``p2p_efficiency`` (`NcclParams`). ``HARNESS_S``, fitted with them, is the measurement's: what the
profiled window of XLA's one-collective program holds besides the collective (not charged
here).
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["FITTED", "HARNESS_S", "NcclArch", "NcclChoice", "NcclParams", "arch_of", "choose", "collective_time_s",
           "nccl_model_applies", "p2p_channels", "p2p_time_s", "steps"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclParams:
    """Fitted constants (module docstring).

    overhead_s: fixed cost of one collective outside NCCL's model (XLA's thunk, the NCCL
      kernel launch), s.
    latency_scale: factor on NCCL's modelled base latency (its table is tuned to rank
      algorithms, not to predict a profiled time).
    hop_latency_scale: factor on NCCL's per-step latency (``hwLatencies``).
    bandwidth_efficiency: factor on NCCL's modelled bandwidth.
    local_copy_efficiency: fraction of the HBM bandwidth NCCL's CTAs reach on their local
      copies.
    p2p_channel_bytes_per_s: what one NCCL channel (one CTA) moves per second on a send or a
      receive of the Simple protocol (LL: half, its 16-byte lines carry 8 bytes of data).
    p2p_duplex: fraction of that rate each direction keeps when one channel carries a send and
      a receive (the CTA's warps are split between them).
    p2p_efficiency: fraction of the NVLink bandwidth (as NCCL counts it) that send/recv reach.
    """

    overhead_s: float
    latency_scale: float
    bandwidth_efficiency: float
    local_copy_efficiency: float
    hop_latency_scale: float = 1.0
    p2p_channel_bytes_per_s: float = 30e9
    p2p_duplex: float = 0.63
    p2p_efficiency: float = 0.8


#: Fitted by benchmarks/gpu_kernels.py (seed 0, the fitting half of xla_collectives_h100.csv).
FITTED = NcclParams(overhead_s=1.392e-6, latency_scale=1.404, hop_latency_scale=1.617,
                    bandwidth_efficiency=1.112, local_copy_efficiency=0.3811,
                    p2p_channel_bytes_per_s=31.52e9, p2p_duplex=0.646, p2p_efficiency=0.7633)
#: Fitted with FITTED: the profiled window of XLA's one-collective program besides the
#: collective (the executable's start and end on the stream), s. Not part of a collective's time.
HARNESS_S = 7.907e-6


@dataclasses.dataclass(frozen=True, slots=True)
class NcclArch:
    """NCCL's per-architecture constants (NVIDIA/nccl src/graph/tuning.cc
    ``ncclTunerConstantsDefaults``, search.cc speed arrays, topo.h NVLink bandwidths)."""

    name: str
    nvlink_bw_per_link_gbps: float     # topo.h SMxx_NVLINK_BW
    nvlink_raw_per_link_gbps: float    # NVLink generation, per link per direction
    ll_max_bw_gbps: float              # llMaxBws[arch][1 node]
    ring_ll128_max_bw_per_ch_gbps: float   # perChMaxRingLL128Bws
    tree_max_bw_per_ch_gbps: float     # perChMaxTreeBws
    tree_ll128_max_bw_per_ch_gbps: float   # perChMaxTreeLL128Bws
    nvls_efficiency: float             # nvlsEfficiency (0: no NVLS)
    speeds_gbps: tuple[float, ...]     # search.cc speedArrayIntra for the arch
    dup_below_gbps: float              # ncclTopoDupChannels: no dup when bwIntra < this (cc > 80)


_SPEEDS_PRE90 = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
ARCHS = {
    8: NcclArch("ampere", 20.0, 25.0, 87.7, 20.0, 24.0, 20.0, 0.0, _SPEEDS_PRE90, 0.0),
    9: NcclArch("hopper", 20.6, 25.0, 141.0, 36.7, 38.7, 36.7, 0.85,
                (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0), 50.0),
    10: NcclArch("blackwell", 40.1, 50.0, 282.0, 40.0, 70.0, 55.6, 0.74,
                 (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0), 50.0),
}

# tuning.cc, microseconds: (LL, LL128, Simple)
_BASE_LAT = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0)}
_HW_LAT_NVLINK = {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0), "nvls": (0.0, 0.0, 25.0)}
_HW_LAT_NET = {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0), "nvls": (0.0, 0.0, 18.0)}
PROTOCOLS = ("LL", "LL128", "Simple")
P2P_LL_THRESHOLD_BYTES = 16384  # NCCL_P2P_LL_THRESHOLD default, per channel (src/enqueue.cc)
P2P_NVL_CHUNK_BYTES = 1 << 19   # NCCL_P2P_NVL_CHUNKSIZE default (src/init.cc): Simple step, NVLink
P2P_NET_CHUNK_BYTES = 1 << 17   # NCCL_P2P_NET_CHUNKSIZE default (src/init.cc): across nodes
LL_STEP_BYTES = 8 * 512 * 8 * 16 // 8  # DEFAULT_LL_BUFFSIZE / NCCL_STEPS (src/init.cc, device.h)
MAX_CHANNELS = 64               # MAXCHANNELS (src/include/device.h), NCCL_MAX_P2P_NCHANNELS default

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
          "collective-permute", "collective-broadcast", "send")


def arch_of(spec) -> NcclArch:
    """NCCL constants for the spec's GPU: by ``target.compute_capability`` major (8, 9, 10+);
    a spec without it gets Hopper's."""
    cc = str((getattr(spec, "target", None) or {}).get("compute_capability", "9.0"))
    try:
        major = int(cc.split(".")[0])
    except ValueError:
        major = 9
    return ARCHS[min(max(major, 8), 10)]


def steps(kind: str, n: int, algorithm: str = "ring") -> int:
    """Latency steps of ``kind`` over ``n`` devices (tuning.cc ``nsteps``; tree all-reduce
    2 (n-1) inside a node, chain up and down; send/recv kinds 1)."""
    if n <= 1:
        return 0
    if kind in ("collective-permute", "send", "all-to-all", "ragged-all-to-all",
                "collective-broadcast"):
        return 1
    if kind == "all-reduce":
        return 2 * (n - 1)
    return n - 1


@dataclasses.dataclass(frozen=True, slots=True)
class NcclChoice:
    """NCCL's pick: algorithm, protocol, its modelled latency (s) and bandwidth (bytes/s);
    ``hop_latency_s``: the part of the latency that is per-step (tuning.cc ``hwLatencies``
    x steps; the rest is ``baseLatencies``)."""

    algorithm: str
    protocol: str
    latency_s: float
    bandwidth_bytes_per_s: float
    hop_latency_s: float = 0.0


def _ring_channels(link_gbps: float, arch: NcclArch) -> tuple[int, float]:
    """(nChannels, bwIntra GB/s) of the ring graph on an NVSwitch node (search.cc)."""
    speed = next((s for s in arch.speeds_gbps if s <= link_gbps), arch.speeds_gbps[-1])
    nch = max(1, int(link_gbps // speed))
    if not (arch.dup_below_gbps and speed < arch.dup_below_gbps and nch > 4):
        nch, speed = 2 * nch, speed / 2
    return nch, speed


def tables(kind: str, n: int, spec, *, spans_nodes: bool = False) -> list[NcclChoice]:
    """NCCL's (algorithm, protocol) candidates for ``kind`` over ``n`` GPUs (module docstring),
    latency in s and algorithm bandwidth in bytes/s of NCCL's ``nBytes``."""
    arch = arch_of(spec)
    if spans_nodes:
        link = (spec.inter_node_bytes_per_s or 0.0) / 1e9
        hw = _HW_LAT_NET
    else:
        link = spec.intra_node_bytes_per_s / 1e9 * arch.nvlink_bw_per_link_gbps / arch.nvlink_raw_per_link_gbps
        hw = _HW_LAT_NVLINK
    nch, bw_intra = _ring_channels(link, arch) if not spans_nodes else (1, link)
    bus = nch * bw_intra
    p2p = kind not in ("all-reduce", "all-gather", "reduce-scatter")
    ns = steps(kind, n)
    out: list[NcclChoice] = []
    for i, p in enumerate(PROTOCOLS):
        if p2p:
            if p == "LL128":
                continue
            bw = min(arch.ll_max_bw_gbps, bus * 0.5) if p == "LL" else bus
            out.append(NcclChoice("p2p", p, (_BASE_LAT["ring"][i] + hw["ring"][i]) * 1e-6, bw * 1e9,
                                  hw["ring"][i] * 1e-6))
            continue
        if p == "LL":
            bw = min(arch.ll_max_bw_gbps, bus * 0.5)
        elif p == "LL128":
            bw = min(bus * 0.92, nch * arch.ring_ll128_max_bw_per_ch_gbps)
        else:
            bw = bus
        out.append(NcclChoice("ring", p, (_BASE_LAT["ring"][i] + ns * hw["ring"][i]) * 1e-6,
                              bw * n / ns * 1e9, ns * hw["ring"][i] * 1e-6))
        if kind == "all-reduce" and not spans_nodes:
            tb = min(bus * 0.92, nch * arch.tree_max_bw_per_ch_gbps)
            if p == "LL":
                tb = min(tb / 3.8, arch.ll_max_bw_gbps)
            elif p == "LL128":
                tb = min(tb * 7.0 / 9.0, nch * arch.tree_ll128_max_bw_per_ch_gbps)
            out.append(NcclChoice("tree", p, (_BASE_LAT["tree"][i] + 2 * (n - 1) * hw["tree"][i]) * 1e-6,
                                  tb * 0.5 * 1e9, 2 * (n - 1) * hw["tree"][i] * 1e-6))
    if not p2p and not spans_nodes and arch.nvls_efficiency > 0 and n >= 2:
        c = n  # NVLS graph: one channel (head) per GPU of the communicator
        per = bus / c * arch.nvls_efficiency * (c - 1) / c
        if kind == "all-reduce":
            bw = c * per * 2.0 * n / ns
        else:
            bw = c * per * (n - 1) / n
        out.append(NcclChoice("nvls", "Simple", hw["nvls"][2] * 1e-6, bw * 1e9, hw["nvls"][2] * 1e-6))
    return out


def _pow2_up(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclasses.dataclass(frozen=True, slots=True)
class P2pChannels:
    """NCCL's send/recv channels of a communicator (src/graph/paths.cc
    ``ncclTopoComputeP2pChannels``, src/enqueue.cc ``scheduleP2pTasksToPlan``).

    p2p_channels: ``p2pnChannels`` = pow2Up(min(comm nChannels, 64)); comm nChannels is twice
      the ring graph's (connect.cc ``ncclTopoPostset``).
    per_peer: ``p2pnChannelsPerPeer`` = pow2Up(min(that, 2 x NVLink bandwidth / per-link
      bandwidth)) (paths.cc ``ncclTopoGetNchannels``), the most channels one send may use.
    min_per_op: ``nChannelsMin``: per_peer halved while x nRanks exceeds p2p_channels.
    """

    p2p_channels: int
    per_peer: int
    min_per_op: int


def p2p_channels(spec, n_ranks: int) -> P2pChannels:
    """Send/recv channels of an ``n_ranks`` communicator on one NVSwitch node of ``spec``'s
    GPUs (H100: ring graph 12 -> comm 24 channels -> 32 p2p channels, 32 per peer; 8 ranks:
    4 per op, 4 ranks: 8, 2 ranks: 16)."""
    arch = arch_of(spec)
    link = spec.intra_node_bytes_per_s / 1e9 * arch.nvlink_bw_per_link_gbps / arch.nvlink_raw_per_link_gbps
    ring, _ = _ring_channels(link, arch)
    comm = min(MAX_CHANNELS, 2 * ring)
    nvl = 2 * max(1, int(link / arch.nvlink_bw_per_link_gbps))
    per_peer = _pow2_up(min(comm, nvl))
    total = _pow2_up(min(comm, MAX_CHANNELS))
    per_peer = min(per_peer, total)
    lo = per_peer
    while lo * n_ranks > total and lo > 1:
        lo //= 2
    return P2pChannels(total, per_peer, lo)


def p2p_op_channels(nbytes: float, protocol: str, ch: P2pChannels, *, spans_nodes: bool = False) -> int:
    """Channels one send (or receive) of ``nbytes`` is split over (src/enqueue.cc
    ``addP2pToPlan``): parts of at least step/8 bytes on ``min_per_op`` channels, doubled while
    a part exceeds 32 steps (across nodes: step/2 and one step), up to ``per_peer``."""
    step = LL_STEP_BYTES if protocol == "LL" else (P2P_NET_CHUNK_BYTES if spans_nodes else P2P_NVL_CHUNK_BYTES)
    lo_part, hi_part = (step / 2, step) if spans_nodes else (step / 8, step * 32)
    if nbytes <= 0:
        return 1
    n = min(ch.min_per_op, math.ceil(nbytes / lo_part))
    part = max(lo_part, math.ceil(nbytes / n))
    while part > hi_part and n <= ch.per_peer // 2:
        n *= 2
        part = math.ceil(nbytes / n)
    return n


def channel_for_part(p2p_channels: int, base: int, part: int) -> int:
    """The channel of part ``part`` of a round-``base`` send/recv (src/include/device.h
    ``ncclP2pChannelForPart``: ``base`` + the part's bits reversed, mod the pow2 count)."""
    bits = max(0, p2p_channels.bit_length() - 1)
    rev = int(format(part, f"0{bits}b")[::-1], 2) if bits else 0
    return (base + rev) % p2p_channels


def p2p_time_s(sends: list[tuple[int, float]], recvs: list[tuple[int, float]], n_ranks: int, spec,
               params: NcclParams, *, spans_nodes: bool = False) -> tuple[float, str]:
    """Seconds NCCL's send/recv kernel takes on one GPU (before ``overhead_s``), and the
    protocol: the GPU's sends ``(round, bytes)`` and receives ``(round, bytes)``, ``round`` the
    peer distance ``(peer - rank) mod n_ranks`` for a send and ``(rank - peer) mod n_ranks`` for
    a receive (round 0: the GPU itself, a local copy) (src/enqueue.cc: one round pairs the send
    to rank + r with the receive from rank - r on the same channels).

    Each op: LL up to ``per_peer x NCCL_P2P_LL_THRESHOLD`` bytes, else Simple; split over
    ``p2p_op_channels`` channels (``channel_for_part``). A channel moves its parts at
    ``p2p_channel_bytes_per_s`` (LL half), ``x p2p_duplex`` per direction when it carries sends
    and receives; the busiest channel sets the time. Not above ``p2p_efficiency`` x the NVLink
    bandwidth as NCCL counts it per direction (across nodes the NIC). Simple adds one step
    (``P2P_NVL_CHUNK_BYTES``) of store-and-forward per part (the sender fills the receiver's
    FIFO step before the receiver copies it out). Latency: tuning.cc ring base + one hop of the
    protocol, x ``latency_scale``.
    """
    ch = p2p_channels(spec, n_ranks)
    arch = arch_of(spec)
    if spans_nodes:
        link = spec.inter_node_bytes_per_s
    else:
        link = spec.intra_node_bytes_per_s * arch.nvlink_bw_per_link_gbps / arch.nvlink_raw_per_link_gbps
    thresh = ch.per_peer * P2P_LL_THRESHOLD_BYTES
    load = [[0.0, 0.0] for _ in range(ch.p2p_channels)]  # seconds of (send, recv) per channel
    fill = 0.0
    wire = [0.0, 0.0]
    any_simple = False
    for d, ops in enumerate((sends, recvs)):
        for rnd, nbytes in ops:
            if nbytes <= 0:
                continue
            ll = rnd != 0 and nbytes <= thresh
            any_simple |= not ll
            rate = params.p2p_channel_bytes_per_s * (0.5 if ll else 1.0)
            nch = p2p_op_channels(nbytes, "LL" if ll else "Simple", ch, spans_nodes=spans_nodes)
            part = nbytes / nch
            for k in range(nch):
                load[channel_for_part(ch.p2p_channels, rnd % ch.p2p_channels, k)][d] += part / rate
            if not ll:
                step = P2P_NET_CHUNK_BYTES if spans_nodes else P2P_NVL_CHUNK_BYTES
                fill = max(fill, min(part, step) / rate)
            if rnd != 0:
                wire[d] += nbytes
    busiest = max((max(s, r) / params.p2p_duplex if s and r else s + r) for s, r in load)
    link_s = max(wire) / (params.p2p_efficiency * link) if link else 0.0
    i = 2 if any_simple else 0
    hw = _HW_LAT_NET if spans_nodes else _HW_LAT_NVLINK
    lat = params.latency_scale * _BASE_LAT["ring"][i] + params.hop_latency_scale * hw["ring"][i]
    return lat * 1e-6 + max(busiest, link_s) + fill, PROTOCOLS[i]


def permute_ops(pairs, device: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]], int]:
    """Rounds of ``device``'s sends and receives in a collective-permute over ``pairs``
    ((source, target) device ids; ranks in the sorted order of the devices named), and the
    communicator size. Bytes are 1 per op (scale by the buffer)."""
    devs = sorted({x for pr in pairs for x in pr})
    n = len(devs)
    rank = {d: i for i, d in enumerate(devs)}
    r = rank[device]
    sends = [((rank[t] - r) % n, 1.0) for s, t in pairs if s == device]
    recvs = [((r - rank[s]) % n, 1.0) for s, t in pairs if t == device]
    return sends, recvs, n


def nccl_bytes(kind: str, wire_bytes: float, n: int) -> float:
    """NCCL's ``nBytes`` from the bytes one device sends (inverse of the ring factors of
    passes/collectives.py): all-reduce buffer, all-gather output, reduce-scatter input;
    send/recv kinds: the wire bytes."""
    if kind == "all-reduce":
        return wire_bytes * n / (2.0 * (n - 1))
    if kind in ("all-gather", "reduce-scatter"):
        return wire_bytes * n / (n - 1)
    return wire_bytes


def local_bytes(kind: str, wire_bytes: float, n: int) -> float:
    """Bytes NCCL's kernel copies within the GPU's memory (module docstring)."""
    nb = nccl_bytes(kind, wire_bytes, n)
    if kind == "all-gather":
        return 2.0 * nb / n
    if kind == "reduce-scatter":
        return nb + nb / n
    if kind == "all-reduce":
        return 2.0 * nb
    if kind in ("all-to-all", "ragged-all-to-all"):
        return 2.0 * wire_bytes / (n - 1)
    return 0.0


def choose(kind: str, wire_bytes: float, n: int, spec, *, spans_nodes: bool = False) -> NcclChoice:
    """The (algorithm, protocol) NCCL picks: the least ``latency + nBytes / bandwidth``."""
    nb = nccl_bytes(kind, wire_bytes, n)
    if kind not in ("all-reduce", "all-gather", "reduce-scatter"):
        cands = tables(kind, n, spec, spans_nodes=spans_nodes)
        n = max(n, 2)
        per = wire_bytes / (n - 1) if kind in ("all-to-all", "ragged-all-to-all") else wire_bytes
        thresh = p2p_channels(spec, n).per_peer * P2P_LL_THRESHOLD_BYTES
        want = "LL" if per <= thresh else "Simple"
        return next(c for c in cands if c.protocol == want)
    return min(tables(kind, n, spec, spans_nodes=spans_nodes),
               key=lambda c: c.latency_s + nb / c.bandwidth_bytes_per_s)


def nccl_model_applies(spec) -> bool:
    """True for a GPU spec with an intra-node bandwidth."""
    return getattr(spec, "kind", None) == "gpu" and bool(spec.intra_node_bytes_per_s)


P2P_KINDS = ("all-to-all", "ragged-all-to-all", "collective-permute", "collective-broadcast", "send")


def collective_time_s(kind: str, wire_bytes: float, group_size: int, spec, *,
                      spans_nodes: bool = False, params: NcclParams = FITTED,
                      pairs: tuple[tuple[int, int], ...] | None = None) -> float | None:
    """Seconds for one execution of a collective (module docstring).

    Args:
      kind: ``all-reduce`` | ``all-gather`` | ``reduce-scatter`` | ``all-to-all`` |
        ``ragged-all-to-all`` | ``collective-permute`` | ``collective-broadcast`` | ``send``
        (``recv`` moves nothing of its own: 0).
      wire_bytes: bytes one device sends (``CollectiveInfo.wire_bytes``).
      group_size: devices per group (2 for point-to-point).
      spec: a GPU HardwareSpec (``intra_node_bytes_per_s``, ``hbm_bytes_per_s``; across
        nodes ``inter_node_bytes_per_s``).
      spans_nodes: a group holds devices of more than one node (then the network ring).
      params: fitted constants.
      pairs: a collective-permute's (source, target) device ids; the time is its slowest
        device's (`permute_ops`: which rounds its send and receive fall in). Without them a
        permute is a shift: each GPU sends to one peer and receives from another.
    Returns:
      seconds; 0.0 when nothing moves; None when the spec lacks the link bandwidth.
    Raises:
      ValueError: an unknown kind or a negative size.
    """
    if kind == "recv":
        return 0.0
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(KINDS)}")
    if wire_bytes < 0 or group_size < 1:
        raise ValueError(f"collective {kind}: wire_bytes={wire_bytes}, group_size={group_size}")
    if wire_bytes == 0 or group_size <= 1:
        return 0.0
    if not (spec.inter_node_bytes_per_s if spans_nodes else spec.intra_node_bytes_per_s):
        return None
    if kind in P2P_KINDS:
        if kind in ("all-to-all", "ragged-all-to-all"):
            n = group_size
            per = wire_bytes / (n - 1)
            rounds = list(range(n))  # round 0: the GPU's own chunk, copied locally
            t, _ = p2p_time_s([(r, per) for r in rounds], [(r, per) for r in rounds], n, spec, params,
                              spans_nodes=spans_nodes)
        else:
            if pairs and kind == "collective-permute":
                worst = 0.0
                devs = sorted({x for pr in pairs for x in pr})
                for dev in devs:
                    snd, rcv, n = permute_ops(pairs, dev)
                    tt, _ = p2p_time_s([(r, b * wire_bytes) for r, b in snd],
                                       [(r, b * wire_bytes) for r, b in rcv], n, spec, params,
                                       spans_nodes=spans_nodes)
                    worst = max(worst, tt)
                t = worst
            else:  # a shift among the group: each GPU sends to one peer, receives from another
                n = max(group_size, 2)
                t, _ = p2p_time_s([(1, wire_bytes)], [(1, wire_bytes)], n, spec, params,
                                  spans_nodes=spans_nodes)
        return params.overhead_s + t
    c = choose(kind, wire_bytes, group_size, spec, spans_nodes=spans_nodes)
    nb = nccl_bytes(kind, wire_bytes, group_size)
    return (params.overhead_s + params.latency_scale * (c.latency_s - c.hop_latency_s)
            + params.hop_latency_scale * c.hop_latency_s
            + nb / (params.bandwidth_efficiency * c.bandwidth_bytes_per_s)
            + local_bytes(kind, wire_bytes, group_size) / (params.local_copy_efficiency * spec.hbm_bytes_per_s))
