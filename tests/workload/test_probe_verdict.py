"""The ranks' side of the probe inside the training launch, in one in-process rank: they wait
after each attempt for the harness's verdict file, and read nothing but a whole, known word."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsim_ddp.scenario.workload import AllreduceProbe
from netsim_ddp.workload.ranks.collective import (
    AGAIN,
    RESULT_FILE,
    TRAIN,
    VERDICT_FILE,
    attempt_dir,
    await_verdict,
    give_verdict,
    run_gated_probe,
)

pytestmark = pytest.mark.usefixtures("one_rank_group")  # tests/workload/conftest.py
TINY_PROBE = AllreduceProbe(size_bytes=4096, iterations=1, warmup=0)


def test_attempts_go_on_until_the_harness_says_train(tmp_path: Path) -> None:
    for attempt, verdict in enumerate((AGAIN, AGAIN, TRAIN)):  # given ahead, found at once
        folder = attempt_dir(tmp_path, attempt)
        folder.mkdir()
        give_verdict(folder, verdict)
    run_gated_probe(TINY_PROBE, tmp_path, timeout_s=5)
    assert all((attempt_dir(tmp_path, n) / RESULT_FILE).is_file() for n in range(3))
    assert not attempt_dir(tmp_path, 3).exists()
    assert not list(tmp_path.rglob("*.tmp"))  # written whole, then renamed


def test_a_word_that_is_no_verdict_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / VERDICT_FILE).write_text("maybe")
    with pytest.raises(RuntimeError, match=r"verdict: 'maybe' is no verdict \(train or again\)"):
        await_verdict(tmp_path / VERDICT_FILE, timeout_s=5)


def test_no_verdict_in_time_is_an_error_not_a_wait_forever(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no verdict on the all-reduce probe .* within 0.05 s"):
        await_verdict(tmp_path / VERDICT_FILE, timeout_s=0.05)
