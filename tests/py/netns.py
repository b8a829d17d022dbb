"""Several "hosts" on one machine for fault tests and network benchmarks.

A Network is a "switch" network namespace holding a Linux bridge, plus one
namespace per host joined to the bridge by a veth pair, and optionally a veth
from the test's own (root) namespace so the test can reach the hosts. Hosts
have no default route: their traffic stays on the bridge. Everything is named
with a per-run prefix "ddpt<pid>-<n>" so parallel runs don't collide and what
a killed run left behind can be recognised (its pid is dead) and removed.

    with netns.Network(3) as net:
        server = net.popen(1, ["python3", "-m", "http.server", "8000"])
        net.wait_port(1, 8000)
        print(net.run(0, ["curl", "-s", "http://%s:8000/" % net.hosts[1].ip]).stdout)
        net.link_down(1)          # partition h1
        net.shape(2, rate="1gbit", delay="0.5ms")

Needs root. close() (also run by the context manager and atexit) removes it
all; a run killed with SIGKILL leaves its namespaces until the next Network()
or remove_stale() in any run removes them. To clean up on SIGTERM too, make
it raise: signal.signal(signal.SIGTERM, signal.default_int_handler).
"""
import atexit
import dataclasses
import fcntl
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

IP = shutil.which("ip") or "/usr/sbin/ip"
TC = shutil.which("tc") or "/usr/sbin/tc"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
# Serialises setup across parallel runs, so two runs can't both pick the same
# free subnet for their root legs before either has added its route.
LOCK = "/run/lock/ddpt-netns.lock" if os.path.isdir("/run/lock") else "/tmp/ddpt-netns.lock"
STALE = re.compile(r"^ddpt(\d+)-")
_counter = itertools.count()
# A unicast MAC no interface has (locally administered): frames sent to it
# are flooded by the bridge and dropped by every host.
NOWHERE = "02:dd:00:00:00:01"


@dataclasses.dataclass(frozen=True)
class Host:
    name: str      # the test's label, e.g. "h0"
    ns: str        # network namespace, e.g. "ddpt1234-0-h0"
    ip: str        # e.g. "10.201.0.1"
    hostname: str  # what `hostname` prints inside, by default the name


def _cmd(args, check=True, timeout=10, input=None):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr.strip()))
    return r


def _ip(*args, ns=None, check=True, input=None):
    return _cmd([IP] + (["-n", ns] if ns else []) + list(args), check=check, input=input)


_available = None


def available():
    """(True, "") when this process can make namespaces, veths and bridges and
    run commands in them; otherwise (False, why), for a test to skip with."""
    global _available
    if _available is None:
        _available = _probe()
    return _available


def _probe():
    if os.geteuid() != 0:
        return False, "network namespaces need root (euid is %d)" % os.geteuid()
    for tool in (IP, TC, UNSHARE):
        if not os.access(tool, os.X_OK):
            return False, "%s is missing (install iproute2 and util-linux)" % tool
    ns = "ddpt%d-probe" % os.getpid()
    steps = [[IP, "netns", "add", ns],
             [IP, "-n", ns, "link", "add", "name", "a", "type", "veth", "peer", "name", "b"],
             [IP, "-n", ns, "link", "add", "name", "br", "type", "bridge"],
             [IP, "netns", "exec", ns, UNSHARE, "--uts", "true"]]
    try:
        for step in steps:
            r = _cmd(step, check=False)
            if r.returncode != 0:
                return False, "`%s` failed: %s" % (" ".join(step[1:]), r.stderr.strip())
        return True, ""
    finally:
        _cmd([IP, "netns", "del", ns], check=False)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _netns_list():
    # `ip netns list` prints "name" or "name (id: N)".
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _kill_inside(namespaces, timeout=3.0):
    """SIGKILLs every process in the namespaces, repeating (bounded) because
    one may fork while we kill."""
    deadline = time.monotonic() + timeout
    while True:
        pids = set()
        for ns in namespaces:
            r = _ip("netns", "pids", ns, check=False)
            pids.update(int(p) for p in r.stdout.split())
        pids.discard(os.getpid())
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("processes %s in %s would not die" % (sorted(pids), namespaces))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def remove_stale():
    """Removes namespaces and root-namespace links named ddpt<pid>-... whose
    pid is dead: what a run killed before its cleanup left behind."""
    with _signals_held(), _lock():
        _remove_stale()


def _remove_stale():
    def dead(name):
        m = STALE.match(name)
        return m is not None and not _pid_alive(int(m.group(1)))
    namespaces = [ns for ns in _netns_list() if dead(ns)]
    if namespaces:
        _kill_inside(namespaces)
    links = [link["ifname"] for link in json.loads(_ip("-j", "link", "show").stdout or "[]")]
    for link in links:
        if dead(link):
            _ip("link", "del", link, check=False)
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)


class _lock:
    def __enter__(self):
        self.f = open(LOCK, "w")
        deadline = time.monotonic() + 60
        while True:
            try:
                return fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.f.close()
                    raise RuntimeError("%s stayed locked for 60 s" % LOCK) from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        self.f.close()


def _free_subnet():
    """A 10.<k>.0.0/24 that overlaps nothing routed in this namespace (any
    table), so the root leg's route can't shadow a real network."""
    used = []
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        if route.get("dst") not in (None, "default"):
            used.append(ipaddress.ip_network(route["dst"], strict=False))
    start = os.getpid() % 50  # spread parallel runs over the candidates
    for k in range(50):
        net = ipaddress.ip_network("10.%d.0.0/24" % (200 + (start + k) % 50))
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free subnet in 10.200.0.0/16-10.249.0.0/16 (all routed)")


def _bits_per_second(rate):
    """tc's rate syntax ("100mbit", "1gbit", "10gbit", "125mbps") in bits/s."""
    m = re.fullmatch(r"([\d.]+)\s*([kmgt]?i?)(bit|bps)?", rate.strip().lower())
    if not m:
        raise ValueError("rate %r is not like '100mbit' or '1gbit'" % rate)
    number, prefix, unit = m.groups()
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
             "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}[prefix]
    return float(number) * scale * (8 if unit == "bps" else 1)


class Network:
    """A switch namespace with a bridge, `hosts` host namespaces on it at
    10.<k>.0.<i+1>/24, and with root_leg a veth from this namespace at
    10.<k>.0.254. `hosts` is a count or a list of names (default h0, h1, ...)."""

    def __init__(self, hosts, prefix=None, root_leg=True):
        names = ["h%d" % i for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if len(set(names)) != len(names):
            raise ValueError("host names %s repeat" % names)
        for name in names:
            if not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", name):
                raise ValueError("host name %r is not a valid host name" % name)
        self.prefix = prefix or "ddpt%d-%d" % (os.getpid(), next(_counter))
        # The root leg's interface is named after the prefix; Linux allows 15 characters.
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", self.prefix):
            raise ValueError("prefix %r must be at most 15 of [A-Za-z0-9_.-]" % self.prefix)
        self.switch = self.prefix + "-sw"
        self.hosts = []
        self.root_ip = None  # 10.<k>.0.254 with root_leg
        self.root_link = None
        self._namespaces = []
        self._procs = []
        self._netem = None
        self._macs = {}  # host index -> the MAC of its eth0
        self._closed = False
        atexit.register(self.close)
        try:
            # A Ctrl-C mid-command could leave an `ip` running on after
            # close(), making what close() just deleted: hold it (~0.1 s).
            with _signals_held(), _lock():
                _remove_stale()
                if any(ns.startswith(self.prefix + "-") for ns in _netns_list()):
                    raise RuntimeError("namespaces named %s-* already exist" % self.prefix)
                self.subnet = _free_subnet()
                self._build(names, root_leg)
        except BaseException:
            self.close()
            raise

    def _build(self, names, root_leg):
        base, bits = self.subnet.network_address, self.subnet.prefixlen
        self._add_ns(self.switch)
        _ip("link", "add", "name", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for i, name in enumerate(names):
            host = Host(name, "%s-%s" % (self.prefix, name), str(base + i + 1), name)
            self._add_ns(host.ns)
            # eth0 in the host, v<i> on the bridge: names are per namespace, so no prefix.
            _ip("link", "add", "name", "eth0", "netns", host.ns, "type", "veth",
                "peer", "name", "v%d" % i, "netns", self.switch)
            _ip("link", "set", "v%d" % i, "master", "br0", "up", ns=self.switch)
            _ip("addr", "add", "%s/%d" % (host.ip, bits), "dev", "eth0", ns=host.ns)
            _ip("link", "set", "eth0", "up", ns=host.ns)
            self.hosts.append(host)
        if root_leg:
            self.root_link = self.prefix
            _ip("link", "add", "name", self.root_link, "type", "veth", "peer", "name", "vroot",
                "netns", self.switch)
            _ip("link", "set", "vroot", "master", "br0", "up", ns=self.switch)
            self.root_ip = str(base + 254)
            _ip("addr", "add", "%s/%d" % (self.root_ip, bits), "dev", self.root_link)
            _ip("link", "set", self.root_link, "up")
        self._static_neighbours()

    def _static_neighbours(self):
        """Permanent ARP entries between all members, so that a cut link is a
        silent black hole: without them, connecting to or from a cut host
        fails with EHOSTUNREACH once ARP gives up (~3 s) instead of hanging."""
        members = [(h.ns, "eth0", h.ip) for h in self.hosts]
        if self.root_link:
            members.append((None, self.root_link, self.root_ip))
        macs = [json.loads(_ip("-j", "link", "show", dev, ns=ns).stdout)[0]["address"]
                for ns, dev, _ in members]
        self._macs = dict(enumerate(macs[:len(self.hosts)]))
        for ns, dev, ip in members:
            _ip("-batch", "-", ns=ns, input="".join(
                "neigh replace %s lladdr %s dev %s nud permanent\n" % (other, mac, dev)
                for (_, _, other), mac in zip(members, macs) if other != ip))

    def _add_ns(self, ns):
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        _ip("link", "set", "lo", "up", ns=ns)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def command(self, i, args, hostname=None):
        """The argv that runs `args` in host i's network namespace, in a UTS
        namespace of its own so it can carry its own host name."""
        host = self.hosts[i]
        return [IP, "netns", "exec", host.ns, UNSHARE, "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', hostname or host.hostname] + list(args)

    def popen(self, i, args, hostname=None, **kwargs):
        """subprocess.Popen of `args` in host i, in a session of its own so the
        test can kill its whole group; close() kills it if still running."""
        kwargs.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(i, args, hostname), **kwargs)
        self._procs.append(p)
        return p

    def run(self, i, args, timeout=10, hostname=None, **kwargs):
        """Like subprocess.run in host i, text output captured by default;
        killed with its group and TimeoutExpired raised after `timeout` s."""
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("text", True)
        p = self.popen(i, args, hostname, **kwargs)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(p)
            p.communicate()
            raise
        finally:
            self._procs.remove(p)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def wait_port(self, i, port, timeout=10.0, addr=None):
        """Waits until a TCP connect from inside host i to addr:port (default
        the host's own address) succeeds; TimeoutError after `timeout` s."""
        script = ("import socket, sys, time\n"
                  "deadline = time.monotonic() + float(sys.argv[3])\n"
                  "while time.monotonic() < deadline:\n"
                  "    try:\n"
                  "        socket.create_connection((sys.argv[1], int(sys.argv[2])), 0.5).close()\n"
                  "        sys.exit(0)\n"
                  "    except OSError:\n"
                  "        time.sleep(0.05)\n"
                  "sys.exit(1)\n")
        addr = addr or self.hosts[i].ip
        r = self.run(i, [sys.executable, "-c", script, addr, str(port), str(timeout)],
                     timeout=timeout + 10)
        if r.returncode != 0:
            raise TimeoutError("nothing accepted on %s:%d in %s after %.1fs %s" % (
                addr, port, self.hosts[i].name, timeout, r.stderr.strip()))

    def _ends(self, i):
        # Both ends of host i's veth: its eth0 and its port on the bridge.
        return [(self.hosts[i].ns, "eth0"), (self.switch, "v%d" % i)]

    def link_down(self, i):
        """Cuts host i's cable at the switch: frames either way are dropped
        silently, so its TCP connections stall, and new ones to or from it
        hang until the caller's timeout; nothing is refused or unreachable."""
        _ip("link", "set", "v%d" % i, "down", ns=self.switch)

    def link_up(self, i):
        _ip("link", "set", "v%d" % i, "up", ns=self.switch)

    def cut_between(self, i, j):
        """Cuts only the path between hosts i and j, silently both ways: each
        sends its frames for the other to a MAC nobody has (its permanent
        neighbour entry for the other replaced), so their TCP connections
        stall and new ones hang, as with link_down, while each still reaches
        every other host. It acts per packet: established connections stall
        too."""
        for a, b in self._pair(i, j):
            _ip("neigh", "replace", self.hosts[b].ip, "lladdr", NOWHERE, "dev", "eth0", "nud",
                "permanent", ns=self.hosts[a].ns)

    def heal_between(self, i, j):
        """Undoes cut_between(i, j)."""
        for a, b in self._pair(i, j):
            _ip("neigh", "replace", self.hosts[b].ip, "lladdr", self._macs[b], "dev", "eth0",
                "nud", "permanent", ns=self.hosts[a].ns)

    def _pair(self, i, j):
        if i == j:
            raise ValueError("host %d can't be cut from itself" % i)
        return ((i, j), (j, i))

    def netem_available(self):
        """(True, "") when the kernel has netem, which shape(delay=...) needs;
        many minimal kernels are built without it."""
        if self._netem is None:
            r = _cmd([TC, "-n", self.switch, "qdisc", "add", "dev", "lo", "root", "netem",
                      "delay", "1ms"], check=False)
            if r.returncode == 0:
                _cmd([TC, "-n", self.switch, "qdisc", "del", "dev", "lo", "root"], check=False)
                self._netem = (True, "")
            else:
                self._netem = (False, "tc netem failed (kernel without CONFIG_NET_SCH_NETEM?): "
                               + r.stderr.strip())
        return self._netem

    def shape(self, i, rate=None, delay=None):
        """Limits both directions of host i's link to `rate` (tc syntax, e.g.
        "100mbit", "10gbit") and adds `delay` each way (e.g. "0.5ms", so the
        round trip gains twice that); shape(i) with neither removes both."""
        if delay is not None and not self.netem_available()[0]:
            raise RuntimeError(self.netem_available()[1])
        qdiscs = []
        if delay is not None:
            # netem's default queue (1000 packets) would drop at high rate x delay.
            qdiscs.append(["root", "handle", "1:", "netem", "delay", delay, "limit", "100000"])
        if rate is not None:
            bytes_per_s = _bits_per_second(rate) / 8
            # A burst of 1 ms of traffic, and at least one 64 KB GSO packet so
            # tbf needn't split them; a queue of at most 50 ms.
            tbf = ["tbf", "rate", rate, "burst", str(int(max(bytes_per_s / 1000, 65536))),
                   "latency", "50ms"]
            where = ["parent", "1:1", "handle", "10:"] if delay is not None else ["root"]
            qdiscs.append(where + tbf)
        for ns, dev in self._ends(i):
            _cmd([TC, "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
        try:
            for ns, dev in self._ends(i):
                for q in qdiscs:
                    _cmd([TC, "-n", ns, "qdisc", "add", "dev", dev] + q)
        except BaseException:
            for ns, dev in self._ends(i):  # not half shaped
                _cmd([TC, "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            raise

    def close(self):
        """Kills what runs in the namespaces and deletes them; idempotent.
        A Ctrl-C or SIGTERM meanwhile is held until the end, not to leave it
        half done; marked done only at the end, so atexit retries anyway."""
        if self._closed:
            return
        with _signals_held():
            for p in self._procs:
                _killpg(p)
            try:
                # Also what left our process groups (setsid, daemons).
                _kill_inside(self._namespaces)
            finally:
                for p in self._procs:
                    try:
                        p.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                # Deleting the veth here rather than with the switch namespace,
                # which the kernel tears down asynchronously.
                if self.root_link:
                    _ip("link", "del", self.root_link, check=False)
                for ns in reversed(self._namespaces):
                    _ip("netns", "del", ns, check=False)
            self._closed = True
            atexit.unregister(self.close)


class _signals_held:
    """Holds SIGINT and SIGTERM while in the block and delivers them after,
    to the handlers there were before. Only the main thread can do this."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.held, self.old = [], None
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, lambda n, _: self.held.append(n)) for s in self.SIGNALS}

    def __exit__(self, *exc):
        if self.old is not None:
            for s, handler in self.old.items():
                signal.signal(s, handler)
            for s in self.held:
                signal.raise_signal(s)


def _killpg(p):
    """Kills p and, if it leads one (start_new_session), its process group.
    Only while unreaped: until then its pid (and group id) can't be reused."""
    if p.poll() is None:
        try:
            if os.getpgid(p.pid) == p.pid:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
        except ProcessLookupError:
            pass
