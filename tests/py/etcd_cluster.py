"""A real etcd cluster for multi-process tests, the twin of tests/etcd_cluster.h:
N members (1 or 3) on free loopback ports, each in its own temporary folder
(data/ and etcd.log, read it when a test fails), with timings short enough
that an election takes under a second.

    with EtcdCluster(3) as etcd:
        endpoints = ",".join(etcd.endpoints)  # "127.0.0.1:PORT,..."
        etcd.kill(0)     # or stop(0) / cont(0)
        etcd.restart(0)  # back on its data, answering

Every wait is bounded and names what it waited for; members are killed
(SIGKILL) and the folder removed on close.

In network namespaces (tests/py/netns.py), members run in hosts of a
Network, listening on those hosts' addresses (the test reaches them through
the network's root leg):

    with netns.Network(4) as net, EtcdCluster(3, net=net, hosts=[0]) as etcd:
        etcd.endpoints       # ["10.x.0.1:2379", "10.x.0.1:2381", ...]
        etcd.member_hosts    # [0, 0, 0]: cut_between(h, 0) parts h from etcd"""
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

START_TIMEOUT = 20  # seconds for every member to answer, at start and restart
_START_ATTEMPTS = 3


class _Exited(Exception):
    """A member exited while starting (most likely: its port was taken)."""


def _find_etcd():
    # /usr/bin: where etcd-server puts it, whatever PATH says.
    found = shutil.which("etcd") or shutil.which("etcd", path="/usr/bin")
    if not found:
        raise RuntimeError("etcd is not installed (no etcd on PATH or in /usr/bin): "
                           "apt-get install etcd-server (deploy/setup.sh installs it)")
    return found


def _free_ports(n):
    """`n` different loopback ports nobody listens on now: all bound at once,
    then released for etcd to take (someone may take one first: the cluster
    starts again then)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _url(ip, port):
    return "http://%s:%d" % (ip, port)


# A namespace is the test's own: fixed ports there, none taken.
_NETNS_CLIENT_PORT = 2379  # member k of a host: 2379 + 2k, its peer port 2380 + 2k


class _Member:
    def __init__(self, name, folder, client_port, peer_port, ip="127.0.0.1", host=None):
        self.name = name
        self.dir = folder
        self.client_port = client_port
        self.peer_port = peer_port
        self.ip = ip
        self.host = host  # its host in the Network, None on loopback
        self.proc = None

    def url(self, port):
        return _url(self.ip, port)


class EtcdCluster:
    """`n` etcd members, started and answering once constructed: on
    loopback, or with `net` (a netns.Network with its root leg) member i in
    host hosts[i % len(hosts)], on that host's address."""

    def __init__(self, n=1, net=None, hosts=(0,), timings="tuned"):
        """`timings`: "tuned" (elections in well under a second, what the
        tests use) or "default" (etcd's own: heartbeat 100 ms, election
        1 s, no pre-vote; what README's example starts)."""
        if timings not in ("tuned", "default"):
            raise ValueError("timings: tuned or default, not %r" % timings)
        self._timings = timings
        self._etcd = _find_etcd()
        self._net = net
        self._hosts = list(hosts)
        self._members = []
        self.dir = None
        atexit.register(self.close)
        for attempt in range(_START_ATTEMPTS):
            self.dir = tempfile.mkdtemp(prefix="ddp-etcd-")
            self._members = self._new_members(n)
            self._token = "ddp-test-%d-%d" % (os.getpid(), attempt)
            try:
                for i in range(n):
                    os.mkdir(self._members[i].dir, 0o700)
                    self._spawn(i, existing=False)
                for i in range(n):
                    self._wait_ready(i)
                return
            except _Exited:
                self.close()
                if attempt + 1 == _START_ATTEMPTS:
                    raise
            except BaseException:
                self.close()
                raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _new_members(self, n):
        if self._net is None:
            ports = _free_ports(2 * n)
            return [_Member("m%d" % i, os.path.join(self.dir, "m%d" % i), ports[2 * i],
                            ports[2 * i + 1]) for i in range(n)]
        members, on_host = [], {}
        for i in range(n):
            host = self._hosts[i % len(self._hosts)]
            k = on_host.get(host, 0)
            on_host[host] = k + 1
            port = _NETNS_CLIENT_PORT + 2 * k
            members.append(_Member("m%d" % i, os.path.join(self.dir, "m%d" % i), port, port + 1,
                                   self._net.hosts[host].ip, host))
        return members

    @property
    def endpoints(self):
        """"IP:PORT" of each member, in member order (IP 127.0.0.1 on loopback)."""
        return ["%s:%d" % (m.ip, m.client_port) for m in self._members]

    @property
    def member_hosts(self):
        """Each member's host index in the Network, in member order (None
        on loopback)."""
        return [m.host for m in self._members]

    def kill(self, i):
        """SIGKILL, and waits for it to die; nothing when already dead."""
        proc = self._members[i].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._members[i].proc = None

    def stop(self, i):
        """SIGSTOP: the member hangs with its sockets open."""
        self._signal(i, signal.SIGSTOP)

    def cont(self, i):
        self._signal(i, signal.SIGCONT)

    def restart(self, i):
        """Kills member `i` if it runs, starts it again on its data and ports
        (--initial-cluster-state existing), and waits until it answers."""
        self.kill(i)
        self._spawn(i, existing=True)
        self._wait_ready(i)

    def log(self, i):
        """The member's log (its stderr), for failure messages."""
        try:
            with open(os.path.join(self._members[i].dir, "etcd.log")) as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def close(self):
        for i in range(len(self._members)):
            self.kill(i)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _signal(self, i, sig):
        proc = self._members[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def _spawn(self, i, existing):
        m = self._members[i]
        initial = ",".join("%s=%s" % (o.name, o.url(o.peer_port)) for o in self._members)
        args = [
            self._etcd,
            "--name=" + m.name,
            "--data-dir=" + os.path.join(m.dir, "data"),
            "--listen-client-urls=" + m.url(m.client_port),
            "--advertise-client-urls=" + m.url(m.client_port),
            "--listen-peer-urls=" + m.url(m.peer_port),
            "--initial-advertise-peer-urls=" + m.url(m.peer_port),
            "--initial-cluster=" + initial,
            "--initial-cluster-state=" + ("existing" if existing else "new"),
            "--initial-cluster-token=" + self._token,
            "--snapshot-count=10000",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=error",
        ]
        if self._timings == "tuned":
            args += [
                # Elections in well under a second (etcd wants the election
                # timeout at least 5 heartbeats); 1 s is then the shortest lease.
                "--heartbeat-interval=50",
                "--election-timeout=500",
                # A restarted member would otherwise force an election as it
                # comes back (off by default in 3.4).
                "--pre-vote=true",
            ]
        with open(os.path.join(m.dir, "etcd.log"), "a") as log:
            if self._net is not None:
                # `ip netns exec` and the rest exec in turn: the pid is etcd's.
                m.proc = self._net.popen(m.host, args, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
            else:
                m.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_ready(self, i):
        """Until member `i`'s /health says true (it has a leader); _Exited,
        with its log, if it exits first."""
        m = self._members[i]

        def healthy():
            if m.proc.poll() is not None:
                raise _Exited("etcd member %s exited with %d; its log:\n%s" % (
                    m.name, m.proc.returncode, self.log(i)))
            try:
                with urllib.request.urlopen(m.url(m.client_port) + "/health", timeout=1) as r:
                    return json.load(r).get("health") == "true"
            except (OSError, ValueError, urllib.error.URLError):
                return False

        # harness.wait_for's shape, without its grpc import: this fixture
        # needs nothing but etcd.
        deadline = time.time() + START_TIMEOUT
        while not healthy():
            if time.time() >= deadline:
                raise AssertionError("timed out after %ds waiting for etcd member %s to answer "
                                     "at %s; its log:\n%s" % (START_TIMEOUT, m.name,
                                                               m.url(m.client_port), self.log(i)))
            time.sleep(0.05)


if __name__ == "__main__":
    # A smoke test of the fixture itself: python3 tests/py/etcd_cluster.py
    started = time.time()
    with EtcdCluster(3) as etcd:
        print("3 members up in %.1fs: %s" % (time.time() - started, etcd.endpoints))
        etcd.kill(0)
        etcd.stop(1)
        etcd.cont(1)
        etcd.restart(0)
        print("killed, stopped, resumed and restarted: %.1fs" % (time.time() - started))
