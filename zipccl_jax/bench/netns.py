"""A bandwidth-limited network of Linux network namespaces, for benchmarks.

    with Network(3) as net:            # needs root and iproute2 (ip, tc)
        net.set_rate("200mbit")
        subprocess.run(net.exec(0, ["python", ...]))

Topology: one namespace per host (`<name>-<i>`, interface `eth0`, address
10.213.0.<i+1>/24) and one for a bridge (`<name>-br`, bridge `br0`, ports
`p<i>`), linked by veth pairs created directly inside the namespaces, so no
interface ever appears in the caller's namespace and parallel runs cannot
clash. Shaping: a `tbf` qdisc on the egress of *both* ends of every veth (the
host's eth0 limits what it sends, the bridge's p<i> what it receives): each
host has a full-duplex link of `rate` to a non-blocking switch.

Each host namespace gets /etc/netns/<ns>/hosts mapping this machine's hostname
to its own address: gloo connects to whatever the hostname resolves to, which
would be 127.0.0.1 otherwise.

Names carry the creating pid (`zcnb-<pid>-<hex>`): `cleanup()` deletes every
namespace whose creator is gone (called on entry: a run killed with SIGKILL
leaves nothing behind for long), or all of ours with `everything=True`
(`python -m zipccl_jax bench net --cleanup`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
from pathlib import Path

PREFIX = "zcnb"
SUBNET = "10.213.0"
NETNS_ETC = Path("/etc/netns")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bits(rate: str) -> float:
    """'200mbit' -> 2e8 bits per second; anything else is a ValueError."""
    m = _RATE.match(rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected a number followed by kbit, mbit or gbit (e.g. 200mbit, 1gbit)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _ip(*args, timeout: float = 30) -> str:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`ip {' '.join(args)}` did not finish in {timeout} s") from None
    if done.returncode:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def _tc(ns: str, *args) -> None:
    _ip("netns", "exec", ns, "tc", *args)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (not root, no ip/tc, or the kernel
    refuses), or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"needs iproute2 ({', '.join(missing)} not found)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as err:
        return f"cannot create a network namespace: {err}"
    _ip("netns", "del", probe)
    return None


def namespaces() -> list[str]:
    """Our namespaces (named PREFIX-...), of any run."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines()
            if line.startswith(PREFIX + "-")]


def _creator_alive(ns: str) -> bool:
    m = re.match(rf"^{PREFIX}-(\d+)-", ns)
    if not m:
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _delete(ns: str) -> None:
    if ns in namespaces():
        _ip("netns", "del", ns)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def cleanup(everything: bool = False) -> list[str]:
    """Deletes our namespaces (and their /etc/netns entries) whose creating
    process is gone, or all of them with `everything`; returns their names."""
    names = set(namespaces()) | {d.name for d in NETNS_ETC.glob(f"{PREFIX}-*")}
    stale = sorted(ns for ns in names if everything or not _creator_alive(ns))
    for ns in stale:
        _delete(ns)
    return stale


class Network:
    """n hosts on a shaped bridge; a context manager that always tears down."""

    def __init__(self, n: int):
        if not 2 <= n <= 200:
            raise ValueError(f"hosts: expected 2 to 200, got {n}")
        self.n = n
        self.name = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.hosts = [f"{self.name}-{i}" for i in range(n)]
        self.bridge = f"{self.name}-br"
        self._old_handlers: dict = {}

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def exec(self, i: int, argv: list[str]) -> list[str]:
        """argv run inside host i's namespace."""
        return ["ip", "netns", "exec", self.hosts[i], *argv]

    def __enter__(self) -> Network:
        for sig in (signal.SIGTERM, signal.SIGHUP):  # so `finally` blocks run on kill
            self._old_handlers[sig] = signal.signal(sig, _raise_exit)
        try:
            cleanup()
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        _ip("netns", "add", self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            _ip("netns", "add", ns)
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.address(i)} {socket.gethostname()}\n")
            _ip("-n", self.bridge, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.bridge, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def set_rate(self, rate: str, burst_ms: float = 1.0) -> None:
        """Shapes every link to `rate` each way (tbf on both veth ends); "off"
        removes the shaping."""
        bits = None if rate == "off" else rate_bits(rate)
        if not burst_ms > 0:
            raise ValueError(f"burst_ms: expected a positive number of milliseconds, got {burst_ms}")
        # The bucket: burst_ms of traffic (at least 8 KB, some full frames; tbf cuts larger GSO frames to
        # fit). What an idle link has saved up leaves at memory speed, so a larger bucket (it was 64 KB)
        # would let a small sync after a pause, as in a training step, beat the rate that back-to-back syncs
        # get; a smaller one loses the link's time whenever the kernel serves the queue late (a busy CPU).
        burst = 0 if bits is None else max(8 << 10, int(bits / 8 * burst_ms / 1000))
        for i, ns in enumerate(self.hosts):
            for where, dev in ((ns, "eth0"), (self.bridge, f"p{i}")):
                shaper = ["tbf", "rate", f"{int(bits)}bit", "burst", str(burst), "latency", "50ms"] if bits else \
                    ["pfifo_fast"]
                _tc(where, "qdisc", "replace", "dev", dev, "root", *shaper)

    def sent_bytes(self, i: int) -> int:
        """Bytes host i has put on its link so far (its bridge port's rx counter)."""
        link = json.loads(_ip("-n", self.bridge, "-j", "-s", "link", "show", f"p{i}"))[0]
        return int(link["stats64"]["rx"]["bytes"])

    def close(self) -> None:
        try:
            for ns in [*self.hosts, self.bridge]:
                _delete(ns)
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)
