"""A subprocess given a time limit that ends it gently: SIGTERM first, so the harness it runs
can take its emulated network and ranks down (SIGKILL would leave the ranks training and
loading the host for the tests that follow), then SIGKILL if that takes two minutes more."""

from __future__ import annotations

import subprocess

import pytest


def run_bounded(argv: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end, or fail the test (`what` names it) with its last output."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        pytest.fail(f"{what} ran past {timeout} s and was stopped; its last output:\n"
                    f"{err[-3000:]}")
    return subprocess.CompletedProcess(argv, process.returncode, out, err)
