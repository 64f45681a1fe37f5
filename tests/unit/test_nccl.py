"""NCCL confined to the emulated NIC: each node's environment, users' settings, and the
transport check, read from real NCCL log lines.

The log lines below are short excerpts of logs people posted in public NCCL issues (cited per
block), so the parser is tested against what NCCL really prints, prefixes included, and not
against lines written to fit it. The format strings they come from are quoted in
netsim_ddp/hostfacts/nccl.py.
"""

import pytest

from netsim_ddp.hostfacts.nccl import (
    merged_env,
    node_env,
    rank_log_lines,
    refused_user_settings,
    verify_transport,
)

# https://github.com/NVIDIA/nccl/issues/952 : 2 nodes x 8 GPUs (ranks 0-7 and 8-15), sockets
# between the nodes, P2P inside them.
TWO_NODES_OF_EIGHT = """\
<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
<cluster_name>:921:1146 [2] NCCL INFO Channel 00/0 : 10[2] -> 9[1] via P2P/IPC/read
<cluster_name>:919:1150 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/Socket/0
<cluster_name>:919:1150 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [send] via NET/Socket/0
""".splitlines()

# https://github.com/NVIDIA/nccl/issues/1232 : mpirun's prefix ("[2] "), ranks dealt round
# robin (node0: 0 and 2, node2: 1 and 3), shared memory inside node0.
ROUND_ROBIN = """\
[0] node0:13571:13571 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
[1] node2:22555:22555 [0] NCCL INFO Channel 00/0 : 2[1] -> 1[0] [receive] via NET/Socket/0
[2] node0:13572:13572 [1] NCCL INFO Channel 00 : 2[1] -> 0[0] via SHM/direct/direct
[1] node2:22555:22555 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [send] via NET/Socket/0
""".splitlines()

# https://github.com/NVIDIA/nccl-tests/issues/179 : the socket transport's interface line
SOCKET_ON_ENO1 = [
    "manolinux:3319:3329 [1] NCCL INFO NET/Socket : Using [0]eno1:10.39.43.133<0>",
    "manolinux:3319:3329 [1] NCCL INFO Using network Socket",
]
# https://github.com/NVIDIA/nccl/issues/1053 : NCCL_SOCKET_IFNAME=lo, traffic on loopback
SOCKET_ON_LO = [
    "axa:3048391:3048566 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo",
    "axa:3048391:3048566 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>",
    "axa:3048391:3048566 [0] NCCL INFO Using network Socket",
]
# https://github.com/NVIDIA/nccl-tests/issues/188 : several interfaces, and busIds in brackets
SEVERAL_INTERFACES = ("user:16902:16954 [3] NCCL INFO NET/Socket : Using [0]ibs85f0:192.168.1.10"
                      "<0> [1]ib0:192.168.1.11<0> [2]ibs102f0:192.168.1.12<0> "
                      "[3]ib2:192.168.1.13<0>")
BUS_IDS = ("user:852751:852807 [1] NCCL INFO Channel 01/0 : 1[2a000] -> 8[27000] [send] "
           "via NET/Socket/0")
USING_IB = "user:695836:695883 [5] NCCL INFO Using network IB"
# https://github.com/NVIDIA/nccl/issues/1358 : two ranks NCCL takes for one host (what
# emulated nodes without distinct host ids would look like): nNodes 1, P2P between them.
ONE_HOST = [
    "LIUCC13-AC-01:106:121 [1] NCCL INFO comm 0x55cd1a0bf930 rank 1 nRanks 2 nNodes 1 "
    "localRanks 2 localRank 1 MNNVL 0",
    "LIUCC13-AC-01:106:120 [0] NCCL INFO comm 0x55cd1a0ba7b0 rank 0 nRanks 2 nNodes 1 "
    "localRanks 2 localRank 0 MNNVL 0",
    "LIUCC13-AC-01:106:121 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/direct pointer",
]
# https://github.com/NVIDIA/nccl/issues/1519 : NCCL counting two hosts
TWO_HOSTS = ("nathan-h100-1:11902:11975 [7] NCCL INFO comm 0x562d61d79a30 rank 7 nRanks 16 "
             "nNodes 2 localRanks 8 localRank 7 MNNVL 0")
# https://github.com/NVIDIA/nccl/issues/1038
VERSION = "host-2:38610:38610 [0] NCCL INFO NCCL version 2.18.3+cuda12.2"


def test_sockets_between_nodes_and_p2p_inside_them_pass():
    evidence = verify_transport([*TWO_NODES_OF_EIGHT, *SOCKET_ON_ENO1, TWO_HOSTS, VERSION],
                                nodes=2, ranks_per_node=8, ifname="eno1")
    assert evidence.ok, evidence.problems
    assert evidence.transports == ["NET/Socket/0", "NET/Socket/3"]
    assert evidence.version == "2.18.3+cuda12.2" and evidence.nccl_nodes == {2}
    assert "via NET/Socket/0, NET/Socket/3 on eno1" in evidence.summary()


def test_another_interface_than_the_emulated_nic_is_refused():
    evidence = verify_transport([*TWO_NODES_OF_EIGHT, *SOCKET_ON_ENO1], nodes=2,
                                ranks_per_node=8)  # the harness wants eth0
    assert not evidence.ok
    assert "interfaces other than eth0" in evidence.summary()
    assert "[0]eno1:10.39.43.133<0>" in evidence.summary()  # the evidence is quoted


def test_loopback_and_several_interfaces_are_refused():
    for lines in (SOCKET_ON_LO, [SEVERAL_INTERFACES]):
        evidence = verify_transport([*TWO_NODES_OF_EIGHT, *lines], nodes=2, ranks_per_node=8,
                                    ifname="ib0")
        assert any("interfaces other than ib0" in p for p in evidence.problems)


def test_nodes_joined_as_one_host_are_refused_with_the_lines():
    evidence = verify_transport(ONE_HOST, nodes=2, ranks_per_node=1)
    assert not evidence.ok
    text = evidence.summary()
    assert "via P2P/direct pointer, not NET/Socket" in text
    assert "1[1] -> 0[0] via P2P/direct pointer" in text
    assert "NCCL counted 1 node(s), the scenario has 2" in text


def test_shared_memory_inside_a_node_is_fine_given_the_node_of_each_rank():
    # round-robin ranks: 2 -> 0 is inside node0 (SHM is what a real node uses)
    evidence = verify_transport([*ROUND_ROBIN, *SOCKET_ON_ENO1], nodes=2, ranks_per_node=2,
                                ifname="eno1", rank_nodes=[0, 1, 0, 1])
    assert evidence.ok, evidence.problems
    # numbered node by node instead, 2 -> 0 would cross nodes through shared memory
    wrong = verify_transport([*ROUND_ROBIN, *SOCKET_ON_ENO1], nodes=2, ranks_per_node=2,
                             ifname="eno1")
    assert any("via SHM/direct/direct, not NET/Socket" in p for p in wrong.problems)


def test_no_channel_lines_means_unverified():
    evidence = verify_transport([*SOCKET_ON_ENO1, VERSION], nodes=2, ranks_per_node=1,
                                ifname="eno1")
    assert not evidence.ok
    assert "no channel between ranks of different nodes" in evidence.summary()


def test_other_networks_and_bus_id_brackets():
    evidence = verify_transport([BUS_IDS, USING_IB, *SOCKET_ON_ENO1], nodes=2, ranks_per_node=8,
                                ifname="eno1")
    assert evidence.transports == ["NET/Socket/0"]  # 1[2a000] -> 8[27000] parsed, and crosses
    assert any("used network IB, not Socket" in p for p in evidence.problems)


def test_a_single_node_has_nothing_to_verify():
    assert verify_transport([], nodes=1, ranks_per_node=4).ok


def test_rank_log_lines_reads_torchrun_tee_files(tmp_path):
    rank_dir = tmp_path / "n0" / "run" / "attempt_0" / "0"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stdout.log").write_text("\n".join(TWO_NODES_OF_EIGHT) + "\n")
    (rank_dir / "stderr.log").write_text("warning\n")
    lines = rank_log_lines(tmp_path)
    assert len(lines) == len(TWO_NODES_OF_EIGHT) + 1
    assert verify_transport([*lines, *SOCKET_ON_ENO1], 2, 8, "eno1").ok


def test_each_node_is_a_host_of_its_own_on_eth0():
    a, b = node_env("abc123", "n0"), node_env("abc123", "n1")
    assert a["NCCL_HOSTID"] != b["NCCL_HOSTID"]
    assert node_env("def456", "n0")["NCCL_HOSTID"] != a["NCCL_HOSTID"]  # runs differ too
    assert a["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert a["NCCL_IB_DISABLE"] == "1" and a["NCCL_NET"] == "Socket"
    assert a["NCCL_DEBUG"] == "INFO" and set(a["NCCL_DEBUG_SUBSYS"].split(",")) == {"INIT", "NET"}


@pytest.mark.parametrize("name, value", [
    ("NCCL_SOCKET_IFNAME", "ib0"), ("NCCL_HOSTID", "same"), ("NCCL_IB_DISABLE", "0"),
    ("NCCL_NET", "IB"), ("NCCL_NET_PLUGIN", "aws-ofi"), ("NCCL_DEBUG", "WARN"),
    ("NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p"), ("NCCL_COLLNET_ENABLE", "1"),
    ("NCCL_SOCKET_FAMILY", "AF_INET6"),
])
def test_settings_that_break_the_emulation_are_refused_with_a_reason(name, value):
    (reason,) = refused_user_settings({name: value, "PATH": "/usr/bin"})
    assert reason.startswith(f"{name}={value}: ") and "unset it" in reason


def test_harmless_settings_pass_through():
    harmless = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "8388608",
                "NCCL_NSOCKS_PERTHREAD": "4", "NCCL_SOCKET_NTHREADS": "2", "NCCL_P2P_DISABLE": "1",
                "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "info", "NCCL_NET": "Socket"}
    assert refused_user_settings(harmless) == []
    env = merged_env({**harmless, "NCCL_DEBUG_SUBSYS": "COLL", "NCCL_DEBUG": "TRACE"}, "r", "n0")
    assert env["NCCL_DEBUG_SUBSYS"] == "COLL,INIT,NET" and env["NCCL_DEBUG"] == "TRACE"
    assert "NCCL_ALGO" not in env  # passed through by the inherited environment, not rewritten
