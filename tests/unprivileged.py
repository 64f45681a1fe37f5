"""netsim-ddp as a new user runs it: not root (CI runs as root, so these tests drop to `nobody`).

The user gets what a user of its own would have: a venv of a Python it can run (this session's
own, or the system's of the same version, so the compiled packages fit), whose site-packages
point at this session's packages, and this checkout on PYTHONPATH. The checkout and the
packages may sit in folders other users cannot enter (/root, a CI workspace), so each command
runs in a mount namespace of its own where both are bind-mounted under a fresh folder that the
user can read: nothing on the host changes (no chmod; the mounts end with the command), and the
folder is removed at the end of the session.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from bounded_run import run_bounded

from netsim_ddp.fabric.naming import user_lock_dir
from netsim_ddp.plugin import lacks_fabric

ROOT = Path(__file__).resolve().parents[1]
USER = "nobody"
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


class UnprivilegedUser:
    """Runs commands as USER, with `python` (a venv it can run, this checkout on its path),
    `netsim_ddp` (its console script), `repo` (this checkout) and `work` (a folder of its own)."""

    def __init__(self, top: Path):
        entry = pwd.getpwnam(USER)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.top = top
        self.repo = top / "repo"
        self.work = top / "work"
        self.home = top / "home"
        self.venv = top / "venv"
        self.python = self.venv / "bin" / "python"
        self.netsim_ddp = self.venv / "bin" / "netsim-ddp"
        sites = sorted({sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")})
        self.binds = [(ROOT, self.repo)] + [(Path(site), top / f"site{i}")
                                            for i, site in enumerate(sites)]

    def command(self, *args: str | os.PathLike, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> list[str]:
        """`args` as USER, in a mount namespace with the binds, in `cwd` (default: work)."""
        count = 2 * len(self.binds)  # sh's positional parameters: the binds, then cwd
        mounts = " && ".join(f'mount --bind "${{{n}}}" "${{{n + 1}}}"' for n in range(1, count, 2))
        script = f'{mounts} && cd "${{{count + 1}}}" && shift {count + 1} && exec "$@"'
        variables = {"PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                     "HOME": str(self.home), "LANG": "C.UTF-8", "PYTHONPATH": str(self.repo),
                     **(env or {})}
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
                *(str(path) for pair in self.binds for path in pair), str(cwd or self.work),
                "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--",
                "env", "-i", *(f"{k}={v}" for k, v in variables.items()), *map(str, args)]

    def run(self, *args: str | os.PathLike, cwd: Path | None = None,
            env: dict[str, str] | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        """Output captured. Past `timeout` it gets SIGTERM, as Ctrl-C would stop it, so a run
        removes its network and ranks (the same exec'd process all the way down: unshare, sh,
        setpriv and env each exec the next), and the test fails."""
        argv = self.command(*args, cwd=cwd, env=env)
        return run_bounded(argv, timeout, f"{' '.join(map(str, args))} as {USER}")

    def as_user(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`args` as USER, without the binds or the venv (checks of the host). Through `env`:
        setpriv itself still holds root's capabilities when it executes the next program, so it
        could start one that USER cannot reach."""
        return subprocess.run(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                               "--clear-groups", "--", "env", "-i", "PATH=/usr/bin:/bin", *args],
                              capture_output=True, text=True, timeout=60, cwd="/")


def _skip_unless_possible() -> None:
    """A session that is not root skips (it tests rootless by running at all); a root one
    that cannot drop to USER lacks what the rootless tests need: a skip, or a failure under
    NETSIM_DDP_REQUIRE_FABRIC (the plugin's lacks_fabric), so CI cannot skip them green."""
    from netsim_ddp.fabric.namespaces import privilege

    if not privilege.host_root():
        pytest.skip("needs root to drop to an unprivileged user (a session that is not root "
                    "tests rootless by running at all)")
    missing = [tool for tool in ("setpriv", "unshare", "mount", "sh") if not shutil.which(tool)]
    if missing:
        lacks_fabric(f"needs util-linux's {', '.join(missing)} to run commands as {USER}")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        lacks_fabric(f"this host has no user {USER!r}")


def _user_python(user: UnprivilegedUser) -> str:
    """A Python VERSION that the user can run: this session's own, else the system's."""
    candidates = [os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                  f"/usr/bin/python{VERSION}", f"/usr/local/bin/python{VERSION}"]
    tried = []
    for candidate in dict.fromkeys(candidates):
        if not os.path.exists(candidate):
            continue
        answer = user.as_user(candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])")
        if answer.returncode == 0 and answer.stdout.strip() == VERSION:
            return candidate
        tried.append(f"{candidate}: {(answer.stderr or answer.stdout).strip()[-200:]}")
    lacks_fabric(f"no Python {VERSION} that {USER} can run ({'; '.join(tried) or 'none found'}): "
                 f"install python{VERSION} system-wide")
    raise AssertionError("unreachable: lacks_fabric skips or fails")  # for mypy and readers


@contextmanager
def unprivileged_user() -> Iterator[UnprivilegedUser]:
    _skip_unless_possible()
    top = Path(tempfile.mkdtemp(prefix="netsim-ddp-unprivileged-"))
    locks: Path | None = None  # the user's lock folder, where these tests made it
    try:
        top.chmod(0o755)
        user = UnprivilegedUser(top)
        if not (found := user_lock_dir(user.uid)).exists():
            locks = found
        for _, mountpoint in user.binds:
            mountpoint.mkdir()
        for folder in (user.work, user.home):
            folder.mkdir()
            os.chown(folder, user.uid, user.gid)
        refused = user.as_user("unshare", "--user", "--map-root-user", "--net", "true")
        if refused.returncode != 0:
            lacks_fabric(f"this host refuses user namespaces to {USER} "
                         f"(unshare --user --map-root-user --net: {refused.stderr.strip()})")
        python = _user_python(user)
        subprocess.run([python, "-m", "venv", "--without-pip", str(user.venv)], check=True,
                       capture_output=True)
        site_packages = user.venv / "lib" / f"python{VERSION}" / "site-packages"
        (site_packages / "netsim-ddp-test.pth").write_text("".join(
            f"import site; site.addsitedir({str(mountpoint)!r})\n"
            for _, mountpoint in user.binds[1:]))
        # What pip writes for the console script `netsim-ddp`.
        user.netsim_ddp.write_text(f"#!{user.python}\nimport sys\nfrom netsim_ddp.cli import "
                                   "main\nsys.exit(main())\n")
        user.netsim_ddp.chmod(0o755)
        ready = user.run("python", "-c", "import netsim_ddp, torch, pyroute2, pytest; "
                         "print(netsim_ddp.__file__)")
        assert ready.returncode == 0 and ready.stdout.startswith(str(user.repo)), \
            f"the venv prepared for {USER} does not import this checkout: {ready.stderr}"
        yield user
    finally:
        # The mounts lived in the commands' own mount namespaces; were one here, removing the
        # folder would remove the checkout.
        mounted = [str(path) for path in top.iterdir() if os.path.ismount(path)]
        assert not mounted, f"bind mounts leaked into this mount namespace: {mounted}"
        shutil.rmtree(top)
        if locks is not None:  # made by the user's runs here: it would outlive the session
            shutil.rmtree(locks, ignore_errors=True)
