"""CPU use from /proc/stat deltas: the diagnosis a refused probe carries."""

from netsim_ddp.hostfacts.hostload import CpuLoad, CpuTimes


def stat(tmp_path, name, user, system, idle, softirq, steal):
    path = tmp_path / name
    # user nice system idle iowait irq softirq steal guest guest_nice, then per-CPU lines
    path.write_text(f"cpu  {user} 0 {system} {idle} 0 0 {softirq} {steal} 0 0\n"
                    f"cpu0 1 2 3 4 5 6 7 8 9 10\n")
    return CpuTimes.read(path)


def test_fractions_of_the_interval(tmp_path):
    before = stat(tmp_path, "a", user=100, system=50, idle=1000, softirq=10, steal=0)
    after = stat(tmp_path, "b", user=160, system=70, idle=1060, softirq=30, steal=40)
    load = CpuLoad.between(before, after)
    # delta: user 60, system 20, idle 60, softirq 20, steal 40; total 200
    assert load == CpuLoad(busy=100 / 200, steal=40 / 200, softirq=20 / 200)
    assert load.describe() == "host CPUs 50% busy, 20% stolen by the hypervisor, 10% in softirq"


def test_unreadable_or_empty_intervals_give_no_diagnosis(tmp_path):
    assert CpuTimes.read(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert CpuTimes.read(tmp_path / "odd") is None
    same = stat(tmp_path, "same", 1, 1, 1, 1, 1)
    assert CpuLoad.between(same, same) is None
    assert CpuLoad.between(None, same) is None


def test_this_hosts_counters_move():
    before = CpuTimes.read()
    sum(i * i for i in range(2_000_000))  # some CPU time to see
    load = CpuLoad.between(before, CpuTimes.read())
    assert before is not None and load is not None and 0 < load.busy <= 1
