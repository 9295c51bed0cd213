"""One real OpenSSH sshd per lab node, listening on its own loopback address."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from backend.errors import LoadmasterError
from lab.process import ManagedProcess, children, wait_gone, wait_port

SSHD_INSTALL_HINT = "install it with: apt-get install -y openssh-server (Debian/Ubuntu)"

#: Where sshd is looked for after PATH: distributions keep it in sbin, often off a user's PATH.
#: A module attribute so tests can take a machine without sshd into account.
SSHD_FALLBACKS: tuple[str, ...] = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def find_sshd() -> str:
    """Absolute path of the sshd binary (sshd refuses to run from a relative path)."""
    for cand in (shutil.which("sshd"), *SSHD_FALLBACKS):
        if cand and os.path.exists(cand):
            return os.path.abspath(cand)
    raise LoadmasterError(f"sshd (OpenSSH server) is not installed; {SSHD_INSTALL_HINT}")


def keygen(path: Path, comment: str) -> None:
    """Generate an ed25519 key pair at ``path`` (no passphrase) unless it exists."""
    if path.exists():
        return
    keygen_bin = shutil.which("ssh-keygen")
    if not keygen_bin:
        raise LoadmasterError(f"ssh-keygen is not installed; {SSHD_INSTALL_HINT}")
    subprocess.run(
        [keygen_bin, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def lab_processes(root: Path) -> list[int]:
    """Pids of every process a lab in ``root`` started: sshd and weed (their command lines name
    the lab's files) and whatever ran on a node (its sessions carry the node's LOADMASTER_HOME),
    including detached jobs that outlived their SSH session."""
    root_s = str(Path(root).resolve())
    markers = (f"{root_s}/nodes/", f"{root_s}/s3")
    home = f"LOADMASTER_HOME={root_s}/".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if any(m in cmdline for m in markers) or any(var.startswith(home) for var in environ.split(b"\0")):
            out.append(int(entry))
    return out


@dataclass
class SshdNode(ManagedProcess):
    """A lab node: sshd on ``ip:port`` with its own PATH dir, scratch and LOADMASTER_HOME; ready
    when it accepts connections. ``sshd -D`` runs in the foreground as our child."""

    name: str
    ip: str
    port: int
    root: Path
    authorized_keys: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    start_timeout = 10.0
    poll_every = 0.0  # the probe waits 0.2 s itself

    @property
    def log_path(self) -> Path:
        return self.root / "sshd.log"

    @property
    def cwd(self) -> Path | None:
        return None

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def user_home(self) -> Path:
        """The login user's home on this node (``HOME`` in its sessions)."""
        return self.root / "user"

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    def prepare(self) -> None:
        """Write host key, sshd_config and the node's directories."""
        for d in (self.root, self.bin_dir, self.scratch, self.home, self.user_home):
            d.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key, f"lab-host-{self.name}")
        env = {
            # A home of the node's own, as a separate machine has: the shell sshd starts would
            # otherwise read this machine's ~/.bashrc (a pyenv init there serialises every session
            # on pyenv's rehash lock, and one left behind by a killed session stalls each login 60 s).
            "HOME": str(self.user_home),
            "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "LOADMASTER_HOME": str(self.home),
            "LOADMASTER_NODE": self.name,
            **self.extra_env,
        }
        setenv = " ".join(f"{k}={v}" for k, v in env.items())
        (self.root / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {self.ip}:{self.port}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "MaxSessions 10",
                    "MaxStartups 10:30:100",
                    "ClientAliveInterval 15",
                    f"SetEnv {setenv}",
                    "Subsystem sftp internal-sftp",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )

    def public_host_key(self) -> str:
        return self.host_key.with_suffix(".pub").read_text().split()[1]

    def args(self) -> list[str]:
        return [find_sshd(), "-D", "-e", "-f", str(self.root / "sshd_config")]

    def before_start(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir

    def ready(self) -> bool:
        return wait_port(self.ip, self.port, 0.2)

    def start_failure(self) -> str:
        return f"lab node {self.name}: sshd did not start on {self.ip}:{self.port}"

    def failure_detail(self) -> str:
        return self.log_path.read_text()[-500:]

    def drop_connections(self) -> int:
        """Kill every live SSH session of this node but keep it listening (a Wi-Fi drop)."""
        if not self.proc:
            return 0
        kids = children(self.proc.pid)
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(kids)

    def stop(self) -> None:
        """Take the node down: its sessions and its listener. Returns once they are all gone, so
        a caller checking for strays (``lab down``, a failed ``lab up``) sees none in flight."""
        if self.proc is None:
            return
        kids = children(self.proc.pid)
        self.drop_connections()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None
        wait_gone(kids, timeout=10.0)
