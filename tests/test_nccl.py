"""NCCL's algorithm x protocol model (lightrail.nccl): closed forms from the cited constants, the tuner's picks,
and the fit recovering parameters from logs the model itself generated."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.errors import ScenarioError, UnsupportedError
from lightrail.nccl import (
    NIC_SEEN,
    NVLINK_SEEN,
    Communicator,
    NcclParams,
    algo_time,
    candidates,
    choose,
    lightrail_schedule,
    p2p_channels,
    p2p_time,
    parse_algorithm,
)
from lightrail.studies.calibrate_nccl import fit_nccl
from lightrail.workload.nccl_tests import NcclRow

US = 1e-6
SIZES = 2.0 ** np.arange(3, 34)  # 8 B .. 8 GiB


def h100(nodes=1, **kw):
    return Communicator(nranks=8 * nodes, gpus_per_node=8, nvlink_Bps=450e9, nic_Bps=50e9, **kw)


def test_ring_allreduce_simple_on_one_node_is_the_closed_form():
    """tuning.cc: Ring/Simple base 8.4 us + 2(p-1) NVLink hops of 3.4 us; bus bandwidth = NVLink as NCCL sees it
    (18 x 20.6 GB/s of 18 x 25), algorithm bandwidth = bus x p / (2(p-1))."""
    comm = h100()
    p = 8
    bus = 450e9 * 20.6 / 25
    want = (8.4 + 2 * (p - 1) * 3.4) * US + SIZES / (bus * p / (2 * (p - 1)))
    np.testing.assert_allclose(algo_time("allreduce", "ring", "Simple", SIZES, comm), want, rtol=1e-12)


def test_ring_allreduce_simple_across_nodes_has_network_steps_and_the_plateau():
    """Two nodes of 8: 30 steps, 2 of them over the network (14 us), the others max(3.4, 3 x 1 us net overhead);
    latency x1.4 once a channel's share of the buffer passes 64 B; bus bandwidth 8 NICs at 48 GB/s, but no more
    than the GPU's NVLink (370.8 GB/s as NCCL sees it)."""
    comm = h100(nodes=2)
    n = 16
    lat = (8.4 + 28 * 3.4 + 2 * 14.0) * US
    bw = min(8 * 50e9 * NIC_SEEN, 450e9 * NVLINK_SEEN["hopper"]) * n / (2 * (n - 1))
    small, big = 1024.0, 2.0**30  # 1 KiB / (16 channels x 16 ranks) < 64 B; 1 GiB is far above
    assert algo_time("allreduce", "ring", "Simple", small, comm) == pytest.approx(lat + small / bw)
    assert algo_time("allreduce", "ring", "Simple", big, comm) == pytest.approx(1.4 * lat + big / bw)


def test_allgather_ring_bandwidth_and_broadcast_latency():
    comm = h100()
    bus = 450e9 * NVLINK_SEEN["hopper"]
    t = algo_time("allgather", "ring", "Simple", 2.0**30, comm)
    assert t == pytest.approx((8.4 + 7 * 3.4) * US + 2.0**30 / (bus * 8 / 7))
    assert algo_time("broadcast", "ring", "LL", 8.0, comm) == pytest.approx((6.6 + 0.6) * US + 8 / min(141e9, bus / 2))


def test_tree_beats_ring_on_latency_and_loses_on_bandwidth_across_many_nodes():
    comm = h100(nodes=16)
    t_ring = choose("allreduce", SIZES, comm, algorithm="ring").seconds
    t_tree = choose("allreduce", SIZES, comm, algorithm="tree").seconds
    assert t_tree[0] < t_ring[0]  # log2(16) network hops against 2 x 15 network steps
    assert t_ring[-1] < t_tree[-1]  # ring's bus bandwidth is not halved nor capped per channel
    auto = choose("allreduce", SIZES, comm)
    assert auto.algorithm[0] == "tree" and auto.algorithm[-1] == "ring"
    np.testing.assert_allclose(auto.seconds, np.minimum(t_ring, t_tree))


def test_ll_for_tiny_messages_simple_for_huge_ones():
    for comm in (h100(), h100(nodes=4)):
        chosen = choose("allreduce", SIZES, comm)
        assert chosen.protocol[0] == "LL" and chosen.protocol[-1] == "Simple"
        times = chosen.seconds
        assert np.all(np.diff(times) >= 0)  # the cheapest of increasing functions increases


def test_a_forced_algorithm_is_honoured_and_its_protocol_still_chosen():
    chosen = choose("allreduce", SIZES, h100(nodes=4, nvls=True), algorithm="ring")
    assert set(chosen.algorithm) == {"ring"} and {"LL", "Simple"} <= set(chosen.protocol)
    with pytest.raises(UnsupportedError, match="ring"):
        choose("broadcast", SIZES, h100(), algorithm="tree")  # NCCL broadcasts with rings only


def test_nvls_only_where_the_switch_multicasts():
    assert not any(a.startswith("nvls") for a, _ in candidates("allreduce", h100()))
    assert ("nvls", "Simple") in candidates("allreduce", h100(nvls=True))
    multi = {a for a, _ in candidates("allreduce", h100(nodes=2, nvls=True))}
    assert "nvls-tree" in multi and "nvls" not in multi  # NVLS across nodes needs CollNet
    assert "nvls" in {a for a, _ in candidates("allreduce", h100(nodes=2, nvls=True, collnet=True))}
    assert {p for a, p in candidates("allreduce", h100(nvls=True)) if a == "nvls"} == {"Simple"}
    assert ("collnet-direct", "Simple") not in candidates("allreduce", h100(nodes=2))
    big = choose("allreduce", [2.0**32], h100(nvls=True))
    assert big.algorithm[0] == "nvls"  # NVLS' doubled bus bandwidth wins at large sizes


def test_point_to_point_and_pat():
    assert candidates("alltoall", h100(nodes=2)) == [("p2p", "Simple")]
    ppn1 = Communicator(nranks=4, gpus_per_node=1, nvlink_Bps=450e9, nic_Bps=50e9)
    assert ("pat", "Simple") in candidates("allgather", ppn1)
    assert ("pat", "Simple") not in candidates("allgather", h100(nodes=2))
    comm = h100(nodes=2)
    q = NcclParams().resolve(comm)
    t = algo_time("alltoall", "p2p", "Simple", 2.0**30, comm)
    assert t == pytest.approx(8.4 * US + 14 * US + 2.0**30 * 8 / 16 / q.nic_Bps)


def test_sendrecv_across_nodes_runs_on_nccls_p2p_channels_per_peer():
    """paths.cc (NCCL 2.29): a peer on another node wants max(1 NIC, ceil(50 GB/s / 14 GB/s per channel)) = 4
    channels (an NVLink peer 2 x 18); p2pnChannels = pow2Up(comm->nChannels) = 2 x 8 ring channels = 16 (no
    Hopper doubling at 16); at 80 ranks the per-peer count halves while perPeer x ceil(80 / 8) > 16: 4 -> 2 -> 1.
    So send/recv moves min(48, 1 x 14) GB/s; at 16 ranks 4 x 14 = 56 > 48 and the NIC binds again. All-to-all's
    72 remote peers spread over all 16 channels (224 GB/s): the NIC binds."""
    big = h100(nodes=10)
    assert big.comm_channels == 16 and p2p_channels(big) == (16, 1)
    assert p2p_channels(h100(nodes=2)) == (16, 4)
    assert p2p_channels(h100(nodes=10, net_channels_per_peer=2)) == (16, 2)  # NCCL_NCHANNELS_PER_NET_PEER=2
    n = 2.0**30
    assert p2p_time("sendrecv", n, big) == pytest.approx((8.4 + 14.0) * US + n / 14e9)
    assert p2p_time("sendrecv", n, h100(nodes=2)) == pytest.approx((8.4 + 14.0) * US + n / 48e9)
    assert p2p_time("sendrecv", n, h100(nodes=10, net_channels_per_peer=2)) == pytest.approx(
        (8.4 + 14.0) * US + n / 28e9)
    assert p2p_time("alltoall", n, big) == pytest.approx((8.4 + 14.0) * US + n * 72 / 80 / 48e9)
    one = h100()  # one node: 2 x 18 NVLink channels per peer, capped at pow2Up(24) = 32; NVLink uncapped
    assert p2p_channels(one) == (32, 32)
    assert p2p_time("sendrecv", n, one) == pytest.approx((8.4 + 3.4) * US + n / (450e9 * NVLINK_SEEN["hopper"]))


def test_fewer_nics_than_gpus_mean_fewer_ring_channels():
    """Polaris-like nodes: 4 A100s, 2 NICs of 200 Gb/s (100 Gb/s per GPU). The ring graph has one channel per NIC
    (2, not 4), so ring LL128 across 8 nodes is capped at 2 x 20 GB/s (tuning.cc perChMaxRingLL128Bws, Ampere)
    below 4 x 12.5 x 0.96 x 0.92 = 44.2 GB/s; tree Simple at 2 x 17.8 GB/s (perChMaxTreeBws, Ampere, > 2 nodes)
    below 48 x 0.92. The bus bandwidth (the node's NICs) is unchanged. Send/recv's one remote peer has a whole
    NIC but one p2p channel: min(25 x 0.96, 1 x 14) GB/s."""
    kw = dict(nranks=32, gpus_per_node=4, nvlink_Bps=300e9, nic_Bps=12.5e9, arch="ampere")
    two, four = Communicator(nics_per_node=2, **kw), Communicator(**kw)
    assert (two.channels, four.channels) == (2, 4) and two.nic_rate_Bps == 25e9
    n = 2.0**30
    lat = algo_time("allreduce", "ring", "LL128", 0.0, two)
    assert algo_time("allreduce", "ring", "LL128", n, two) - lat == pytest.approx(n / (40e9 * 32 / 62))
    lat4 = algo_time("allreduce", "ring", "LL128", 0.0, four)
    assert algo_time("allreduce", "ring", "LL128", n, four) - lat4 == pytest.approx(
        n / (4 * 12.5e9 * NIC_SEEN * 0.92 * 32 / 62))
    tree = algo_time("allreduce", "tree", "Simple", n, two) - algo_time("allreduce", "tree", "Simple", 0.0, two)
    assert tree == pytest.approx(n / (2 * 17.8e9 * 0.5))  # log2(2^30 / 64) = 24 >= 23: no tree correction
    # p2pnChannels = 2 x 2 = 4; a remote peer wants ceil(25 / 14) = 2, halved as 2 x ceil(32 / 8) = 8 > 4 -> 1
    assert p2p_channels(two) == (4, 1)
    assert p2p_time("sendrecv", n, two) == pytest.approx((8.4 + 14.0) * US + n / 14e9)
    with pytest.raises(ScenarioError, match="nics_per_node"):
        Communicator(nics_per_node=0, **kw)


def test_a_bandwidth_a_cap_hides_is_reported_as_undetermined():
    """Send/recv at 80 ranks is bound by its one p2p channel: the fit finds the channel's rate, flags the NIC's as
    not determined and says so; all-to-all on the same ranks is bound by the NIC, which is determined."""
    comm = h100(nodes=10)
    truth = NcclParams(p2p_net_channel_Bps=15e9, nic_Bps=45e9)
    sizes = 2.0 ** np.arange(20, 34)
    cal = fit_nccl(rows_of(sizes, p2p_time("sendrecv", sizes, comm, truth), 0.01), kind="sendrecv", comm=comm)
    assert cal.params["p2p_net_channel_Bps"] == pytest.approx(15e9, rel=0.03)
    assert cal.bandwidth_identified == {"nvlink_Bps": False, "nic_Bps": False}
    assert sum("not determined by the data" in w for w in cal.warnings) == 2
    cal = fit_nccl(rows_of(sizes, p2p_time("alltoall", sizes, comm, truth), 0.01), kind="alltoall", comm=comm)
    assert cal.params["nic_Bps"] == pytest.approx(45e9, rel=0.03)
    assert cal.bandwidth_identified["nic_Bps"] and not any("not determined" in w and "NIC" in w for w in cal.warnings)


def test_names_and_schedules():
    assert parse_algorithm("NVLSTree") == "nvls-tree" and parse_algorithm("CollNet_Direct") == "collnet-direct"
    with pytest.raises(ScenarioError, match="algo"):
        parse_algorithm("hypercube", field="--algo")
    assert lightrail_schedule("allreduce", "ring") == "ring"
    assert lightrail_schedule("allreduce", "tree") == "double-binary-tree"
    assert lightrail_schedule("allreduce", "nvls") == "direct"
    assert lightrail_schedule("alltoall", "p2p") == "pairwise"
    assert lightrail_schedule("broadcast", "ring") is None  # no ring broadcast registered
    from lightrail.collectives.registry import get

    for kind in ("allreduce", "allgather", "reducescatter"):
        for algo in ("ring", "tree", "nvls", "nvls-tree", "collnet-direct", "pat"):
            name = lightrail_schedule(kind, algo)
            assert name is None or get(kind, name).name == name


def test_bad_communicators_name_the_field():
    with pytest.raises(ScenarioError, match="nranks"):
        Communicator(nranks=12, gpus_per_node=8, nvlink_Bps=1e9, nic_Bps=1e9)
    with pytest.raises(ScenarioError, match="arch"):
        Communicator(nranks=8, gpus_per_node=8, nvlink_Bps=1e9, nic_Bps=1e9, arch="pascal")


def rows_of(sizes, times, noise, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, (s, t) in enumerate(zip(sizes, times, strict=True)):
        a, b = t * (1 + noise * rng.standard_normal(2))
        out.append(NcclRow(i + 1, int(s), int(s) // 4, "float", "sum", -1, a, 0.0, 0.0, b, 0.0))
    return out


@pytest.mark.parametrize("nodes, nvls, binds", [(1, False, "nvlink"), (1, True, "nvls"), (4, False, "nic"),
                                                (4, True, "nic")])
def test_the_fit_recovers_parameters_the_model_generated(nodes, nvls, binds):
    """Logs made by the model at known parameters (latencies 1.2-2x NCCL's, NVLink 0.9x, NICs 0.6x) plus 2% noise
    are fitted back: the error is the noise, the picks agree, and the bandwidth that binds is recovered (NVLink on
    one node, where with NVLS only its product with NVLS' efficiency shows; across four nodes the NICs). On two
    nodes ring and tree reach about the same bandwidth, so the data cannot tell them apart: not a case here."""
    comm = h100(nodes=nodes, nvls=nvls)
    d = NcclParams().resolve(comm)
    truth = NcclParams(base_latency_s=tuple(1.5 * v for v in d.base_latency_s),
                       nvlink_latency_s=tuple(1.2 * v for v in d.nvlink_latency_s),
                       net_latency_s=tuple(2.0 * v for v in d.net_latency_s),
                       nvlink_Bps=0.9 * d.nvlink_Bps, nic_Bps=0.6 * d.nic_Bps)
    times = choose("allreduce", SIZES, comm, truth).seconds
    cal = fit_nccl(rows_of(SIZES, times, 0.02), kind="allreduce", comm=comm)
    assert cal.rms_relative_error < 0.03
    q = cal.params
    if binds == "nic":
        assert q["nic_Bps"] == pytest.approx(truth.nic_Bps, rel=0.05)
    elif binds == "nvls":
        assert q["nvlink_Bps"] * q["nvls_efficiency"] == pytest.approx(truth.nvlink_Bps * d.nvls_efficiency, rel=0.05)
    else:
        assert q["nvlink_Bps"] == pytest.approx(truth.nvlink_Bps, rel=0.05)
    want = choose("allreduce", SIZES, comm, truth)
    got = [(c["algorithm"], c["protocol"]) for c in cal.choices]
    agree = np.mean([g == (a, p) for g, a, p in zip(got, want.algorithm, want.protocol, strict=True)])
    assert agree > 0.8
    assert not [w for w in cal.warnings if "not determined" not in w]
    assert cal.bandwidth_identified[{"nic": "nic_Bps"}.get(binds, "nvlink_Bps")]
