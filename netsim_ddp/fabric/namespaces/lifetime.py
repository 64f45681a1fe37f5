"""A run's processes live in a PID namespace of their own, whose init dies with the harness.

When the init (PID 1) of a PID namespace dies, the kernel SIGKILLs every process in it. The init
here is a fork of the harness (no exec: nothing to find or read on disk, which a rootless user may
not be able to) that ignores SIGCHLD, so the kernel reaps orphans for it, and reads a pipe whose
only write end the harness holds: however the harness ends, SIGKILL included, the kernel closes
that end, the init sees EOF and exits, and every rank, torchrun, forwarder and background flow
of the run dies with it. It also asks for SIGKILL when the thread that forked it exits
(PR_SET_PDEATHSIG; the pipe covers the instant before it asked).

Namespaces belong to threads, and a thread may make a new PID namespace for its children only
while its own and its children's are the same, so once. Each run therefore gets a thread of its
own: it unshares, starts the init first (the first child becomes PID 1), and then starts every
process of the run; callers hand it their Popen calls. Children are still the harness's (it
waits for them as usual); inside, they see their own pids but the host's /proc.

Every process also gets PYTHONSAFEPATH=1 (Python never puts the working directory, or a script's
folder, on sys.path: a `json.py` where someone runs `sudo netsim-ddp run` is never imported) and
the run's id (naming.RUN_ID_ENV), so `clean` can tell a dead run's processes from a live one's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.namespaces import netns

CLONE_NEWPID = 0x20000000
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}
_GONE_WAIT_S = 10.0

PR_SET_PDEATHSIG = 1


def _init_main(lifeline: int) -> NoReturn:
    """PID 1 of the run's namespace (a forked child: only async-signal-safe-ish calls, no
    imports, no locks)."""
    try:
        os.setsid()  # a terminal's Ctrl-C is for the harness, which tears down in order
        netns.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.closerange(3, lifeline)  # the harness's sockets, locks and pipes are not ours
        os.closerange(lifeline + 1, os.sysconf("SC_OPEN_MAX"))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # orphans are reaped by the kernel
        while os.read(lifeline, 64):
            pass
    finally:
        os._exit(0)


class _Init:
    """The init's pid and exit status (it is our child, but not a Popen)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:
                    return None
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class ProcessNamespace:
    """Starts processes inside a fresh PID namespace; closing it (or the harness dying) kills
    every process in it at once."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._env = {**SAFE_PATH_ENV, naming.RUN_ID_ENV: run_id}
        self._executor: ThreadPoolExecutor | None = None
        self._init: _Init | None = None
        self._lifeline: int | None = None
        self._started: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def __enter__(self) -> ProcessNamespace:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"nsd{self.run_id}-spawner")
        try:
            self._executor.submit(self._start_init).result()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def init_pid(self) -> int | None:
        return self._init.pid if self._init else None

    def _start_init(self) -> None:
        """On the spawner thread: a new PID namespace for its children, and its init."""
        if netns.libc.unshare(CLONE_NEWPID) != 0:
            code = ctypes.get_errno()
            raise FabricError(f"cannot create a PID namespace for the run's processes "
                              f"({os.strerror(code)}); without one they could outlive the run")
        read, write = os.pipe()  # both close-on-exec: no process the run starts holds them
        try:
            with warnings.catch_warnings():  # 3.12 warns of fork with threads; see _init_main
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                os.close(write)
                _init_main(read)
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        self._init = _Init(pid)
        self._lifeline = write

    def popen(self, argv: Sequence[str], netns_name: str | None = None,
              **kwargs: Any) -> subprocess.Popen:
        """subprocess.Popen(argv, **kwargs) in the run's PID namespace, inside the named
        network namespace if given; `env` (default: ours) gets PYTHONSAFEPATH and the run id."""
        if self._executor is None:
            raise FabricError("the run's process namespace is closed")
        env: Mapping[str, str] = kwargs.pop("env", None) or os.environ
        env = {**env, **self._env}

        def start() -> subprocess.Popen:
            assert self._init is not None
            if self._init.poll() is not None:
                raise FabricError(f"the run's PID namespace is gone (its init exited with "
                                  f"{self._init.returncode}): no process can start in it")
            entered = netns.entered(netns_name) if netns_name else contextlib.nullcontext()
            with entered:
                process = subprocess.Popen(list(argv), env=env, **kwargs)
            with self._lock:
                self._started.append(process)
            return process

        return self._executor.submit(start).result()

    def close(self) -> None:
        """SIGKILL every process in the namespace and wait until they are gone."""
        executor, self._executor = self._executor, None
        init, self._init = self._init, None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        try:
            if init is not None:
                init.kill()  # the kernel kills everything else in the namespace
                self._wait_gone(init)
        finally:
            if executor is not None:
                executor.shutdown(wait=True)

    def _wait_gone(self, init: _Init) -> None:
        """Until the init is reaped. The kernel lets it finish only once every process of the
        namespace is released, and those that are our own children only once we reap them."""
        deadline = time.monotonic() + _GONE_WAIT_S
        while init.poll() is None:
            with self._lock:
                started = list(self._started)
            for process in started:
                process.poll()
            if time.monotonic() > deadline:
                raise FabricError(f"the run's PID namespace (init pid {init.pid}) did not end "
                                  f"within {_GONE_WAIT_S:g} s of SIGKILL")
            time.sleep(0.005)
