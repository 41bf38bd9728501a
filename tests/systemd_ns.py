"""A real systemd (the host's /lib/systemd/systemd, as PID 1) in private namespaces, to start a
unit that ``ceiling deploy`` wrote and watch it become ready, log to the journal and restart.

Isolation, because the machine is shared: new PID, mount, network (loopback only), UTS and
cgroup namespaces; a private tmpfs on /run, on /dev/shm (ceiling's shm clean-up must not see the
host's segments: from inside a PID namespace every host process is invisible, so every segment
would look stale) and cgroup hierarchies rooted in the namespace. ``sysinit.target`` and the
other boot targets are masked: booting them on the host's root filesystem would run
systemd-tmpfiles ``--remove`` (which empties /tmp), sysctl, module loading... Only the unit under
test, its ``network-online.target`` and journald (volatile) start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SYSTEMD = Path("/lib/systemd/systemd")
MASKED = (
    "sysinit.target", "basic.target", "sockets.target", "timers.target", "paths.target",
    "local-fs.target", "swap.target", "multi-user.target", "graphical.target", "network.target",
    "getty.target", "remote-fs.target",
)  # fmt: skip

BOOT = """\
set -eu
mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o size=256m tmpfs /dev/shm
mount -t tmpfs -o mode=755 cgroup-root /sys/fs/cgroup
mkdir /sys/fs/cgroup/unified /sys/fs/cgroup/systemd
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup/unified
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
mkdir -p /run/systemd/system/{unit}.d /run/systemd/journald.conf.d
cp {unit_path} /run/systemd/system/{unit}
printf '[Unit]\\nDefaultDependencies=no\\n' > /run/systemd/system/{unit}.d/test.conf
printf '[Journal]\\nStorage=volatile\\n' > /run/systemd/journald.conf.d/test.conf
for t in {masked}; do ln -s /dev/null /run/systemd/system/$t; done
printf '[Unit]\\nDefaultDependencies=no\\nWants={unit} systemd-journald.socket\\n' \\
  > /run/systemd/system/ceiling-test.target
export container=ceiling-test
exec {systemd} --system --unit=ceiling-test.target
"""


def available() -> str | None:
    """None when this machine can run it, else why not."""
    if os.geteuid() != 0:
        return "needs root (namespaces, mounts)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not SYSTEMD.exists():
        return f"{SYSTEMD} is not installed"
    return None


class NestedSystemd:
    def __init__(self, unit_path: Path, workdir: Path) -> None:
        self.unit_path = unit_path
        self.unit = unit_path.name
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None  # systemd's PID as the host sees it

    def __enter__(self) -> NestedSystemd:
        boot = self.workdir / "boot.sh"
        boot.write_text(
            BOOT.format(
                unit=self.unit,
                unit_path=self.unit_path,
                masked=" ".join(MASKED),
                systemd=SYSTEMD,
            )
        )
        log = (self.workdir / "systemd-console.log").open("wb")
        # our own cgroup in each hierarchy first: the cgroup namespace (and so the nested
        # systemd's init.scope, system.slice) is rooted there, not at the host's root
        self.cgroups = [
            Path(f"/sys/fs/cgroup/{h}/ceiling-test-{os.getpid()}-{id(self)}")
            for h in ("unified", "systemd")
            if Path(f"/sys/fs/cgroup/{h}/cgroup.procs").exists()
        ]
        for cg in self.cgroups:
            cg.mkdir()
        enter = "".join(f"echo $$ > {cg}/cgroup.procs; " for cg in self.cgroups)
        unshare = (
            "unshare --fork --pid --mount --net --uts --cgroup --mount-proc "
            f"--propagation private bash {boot}"
        )
        self.proc = subprocess.Popen(
            ["bash", "-c", f"{enter}exec {unshare}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            try:
                child = int(kids.read_text().split()[0])
                if Path(f"/proc/{child}/exe").resolve() == SYSTEMD.resolve():
                    self.pid = child
                    if self.ctl("is-system-running").stdout.strip() in (
                        "running", "degraded", "starting",
                    ):  # fmt: skip
                        return self
            except (OSError, IndexError, ValueError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.__exit__(None, None, None)
        console = (self.workdir / "systemd-console.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"systemd did not come up in its namespaces:\n{console}")

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A command inside the namespaces (systemctl, journalctl, kill, an HTTP probe)."""
        assert self.pid is not None
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-n", "-u", "-C", *argv],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", *args)

    def show(self, *props: str) -> dict[str, str]:
        out = self.ctl("show", self.unit, *[f"-p{p}" for p in props]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_for(self, want: dict[str, str], timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        state: dict[str, str] = {}
        while time.monotonic() < deadline:
            state = self.show(*want)
            if all(state.get(k) == v for k, v in want.items()):
                return state
            time.sleep(0.3)
        raise AssertionError(f"{self.unit}: wanted {want}, last seen {state}")

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            self.ctl("poweroff", "--no-block")
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # SIGKILL to a PID namespace's init ends every process in it
                if self.pid is not None:
                    os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for cg in getattr(self, "cgroups", []):  # deepest first; all empty once systemd is gone
            for sub in sorted(cg.rglob("*"), key=lambda p: -len(p.parts)):
                if sub.is_dir():
                    sub.rmdir()
            cg.rmdir()
