"""The per-connection sampler's bookkeeping, fed tcp_info as sock_diag returns it: a
connection's timeouts are the kernel's count where its tcp_info has one, else its entries into
the Loss state; its retransmissions a running total; both summed per direction and kind;
loopback and unknown peers are not connections between nodes. (tests/netns/
test_racks_netns.py samples real ones.)"""

import struct
from types import SimpleNamespace

import pytest

from netsim_ddp.fabric.counters.connection_sampler import TCP_CA_LOSS, ConnectionSampler, total_rto
from netsim_ddp.measure.attribution import CounterSeries


class Message(dict):
    def get_attr(self, name):
        return self["info"] if name == "INET_DIAG_INFO" else None


def message(inode, destination, ca_state=0, retrans=0):
    return Message(idiag_inode=inode, idiag_dst=destination,
                   info={"tcpi_ca_state": ca_state, "tcpi_total_retrans": retrans})


class Diag:
    def __init__(self, *rounds):
        self.rounds = list(rounds)

    def get_sock_stats(self, **_):
        return self.rounds.pop(0)


@pytest.fixture
def sampler(monkeypatch):
    plan = SimpleNamespace(nodes=[SimpleNamespace(index=i, netns=f"nsdx-n{i}",
                                                  address=f"10.0.0.{i + 1}") for i in range(3)])
    monkeypatch.setattr("netsim_ddp.fabric.counters.connection_sampler._background_sockets",
                        lambda plan, index: {(0, 7)} if index == 0 else set())
    return ConnectionSampler(plan)


def test_timeouts_are_entries_into_loss_and_retransmissions_a_running_total(sampler):
    diag = Diag(
        [message(5, "10.0.0.2"), message(7, "10.0.0.3", retrans=4), message(9, "127.0.0.1")],
        [message(5, "10.0.0.2", TCP_CA_LOSS, 3), message(7, "10.0.0.3", retrans=6)],
        [message(5, "10.0.0.2", TCP_CA_LOSS, 5)],  # still recovering: the same timeout
        [message(5, "10.0.0.2", 0, 5)],
        [message(5, "10.0.0.2", TCP_CA_LOSS, 9)])  # a second one
    for now in range(5):
        sampler._read(0, diag)
        sampler._record(float(now))
    samples = sampler.samples
    # Each change with the sample before it: a window between two changes sees no growth.
    assert samples["job n0->n1 timeouts"] == [(0.0, 0.0), (1.0, 1.0), (3.0, 1.0), (4.0, 2.0)]
    assert samples["job n0->n1 retransmitted"] == [(0.0, 0.0), (1.0, 3.0), (2.0, 5.0),
                                                   (3.0, 5.0), (4.0, 9.0)]
    timeouts = CounterSeries("t", None, samples["job n0->n1 timeouts"])
    assert timeouts.growth(1.5, 2.5) == 0 and timeouts.growth(3.5, 4.5) == 1
    assert timeouts.growth(0.5, 1.5) == 1
    # Inode 7 belongs to a background flow's process: the neighbour's, counted apart.
    assert samples["neighbour n0->n2 retransmitted"] == [(0.0, 0.0), (0.0, 4.0), (1.0, 6.0)]
    assert not any("127" in name or "n0->n0" in name for name in samples)
    assert set(sampler.grown()) == {"job n0->n1 timeouts", "job n0->n1 retransmitted",
                                    "neighbour n0->n2 retransmitted"}


class RawInfo(dict):
    """tcp_info as pyroute2 decodes it, with the attribute's bytes: `length` 284 (Linux 6.7+)
    carries tcpi_total_rto at byte 240 of the struct."""

    offset = 8  # where the attribute starts in the message

    def __init__(self, total_rto, length=284, **fields):
        super().__init__(tcpi_ca_state=0, tcpi_total_retrans=0, **fields)
        self.length = length
        self.data = bytearray(self.offset + length)
        if length >= 4 + 242:
            struct.pack_into("=H", self.data, self.offset + 4 + 240, total_rto)


def test_the_kernels_own_timeout_count_where_it_has_one(sampler):
    assert total_rto(RawInfo(3)) == 3
    assert total_rto(RawInfo(3, length=4 + 232)) is None  # an older kernel's tcp_info
    assert total_rto({"tcpi_ca_state": 0}) is None
    # Counted by the kernel: timeouts whose Loss state no sample saw count too.
    rounds = [[Message(idiag_inode=5, idiag_dst="10.0.0.2", info=RawInfo(n))] for n in (0, 2, 2)]
    diag = Diag(*rounds)
    for now in range(3):
        sampler._read(0, diag)
        sampler._record(float(now))
    assert sampler.samples["job n0->n1 timeouts"] == [(0.0, 0.0), (1.0, 2.0)]
