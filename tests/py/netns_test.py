#!/usr/bin/python3
"""netns.Network: hosts reach each other and the test, carry their own host
names, can be partitioned and shaped, and leave nothing behind, even after an
exception, a Ctrl-C or a run killed mid-test. Skips where namespaces can't be
made (not root, no iproute2)."""
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

PY = sys.executable
PORT = 7000

# Echo lines; "GET n" sends n bytes, "PUT n" reads n bytes and answers "ok".
# Exits after argv[2] seconds so it can't outlive a broken test for long.
SERVER = r"""
import contextlib, socket, sys, threading, time
deadline = time.monotonic() + float(sys.argv[2])
s = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=16)
s.settimeout(0.2)
def serve(c):
    with c, contextlib.suppress(OSError):
        c.settimeout(30)
        f = c.makefile("rb")
        for line in f:
            if line.startswith(b"GET "):
                c.sendall(b"x" * int(line[4:]))
                return
            if line.startswith(b"PUT "):
                n = int(line[4:])
                while n > 0:
                    b = f.read1(min(n, 1 << 16))
                    if not b:
                        return
                    n -= len(b)
                c.sendall(b"ok\n")
                return
            c.sendall(line)
while time.monotonic() < deadline:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# One exchange with SERVER, connecting for at most 1 s; prints JSON
# {"result": "ok"|"timeout"|"error", "seconds": ...}.
CLIENT = r"""
import json, socket, sys, time
addr, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0 = time.monotonic()
try:
    c = socket.create_connection((addr, port), timeout=1.0)
    c.settimeout(10)
    if mode == "echo":
        c.sendall(b"ping\n")
        ok = c.makefile("rb").readline() == b"ping\n"
    elif mode.startswith("get"):
        n = int(mode[3:])
        c.sendall(b"GET %d\n" % n)
        while n > 0:
            b = c.recv(1 << 16)
            if not b:
                break
            n -= len(b)
        ok = n == 0
    else:
        n = int(mode[3:])
        c.sendall(b"PUT %d\n" % n + b"x" * n)
        ok = c.makefile("rb").readline() == b"ok\n"
    result = {"result": "ok" if ok else "bad"}
except socket.timeout:
    result = {"result": "timeout"}
except OSError as e:
    result = {"result": "error", "error": str(e)}
result["seconds"] = time.monotonic() - t0
print(json.dumps(result))
"""

# A sleeper that starts another in a session of its own (out of reach of
# killpg, only `ip netns pids` finds it) and prints that one's pid.
SLEEPERS = ["sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 300"]

# A test run in a child process: makes a Network, starts SLEEPERS (argv[3])
# in h0, prints what it made, then ends as argv[1] says.
CHILD = r"""
import json, select, signal, subprocess, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # even if our parent ignores it
sys.path.insert(0, sys.argv[2])
import netns
def start(net):
    p = net.popen(0, json.loads(sys.argv[3]), stdout=subprocess.PIPE, text=True)
    print(json.dumps({"prefix": net.prefix, "pids": [p.pid, int(p.stdout.readline())]}), flush=True)
if sys.argv[1] == "atexit":
    start(netns.Network(2))
    sys.exit(0)  # no close(): atexit's
with netns.Network(2) as net:
    start(net)
    # Until SIGINT or SIGKILL, or the test dies (stdin's EOF), for at most 30 s.
    select.select([sys.stdin], [], [], 30)
"""


class SimulatedCtrlC(KeyboardInterrupt):
    """Not a plain KeyboardInterrupt, so a real Ctrl-C still stops the run."""


def alive(pid):
    """Running, not a zombie waiting for a reaper that may not reap."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def leftovers(prefix):
    """Namespaces and root-namespace links still named prefix-*."""
    names = netns._netns_list() + [
        link["ifname"] for link in json.loads(netns._ip("-j", "link", "show").stdout)]
    return [n for n in names if n == prefix or n.startswith(prefix + "-")]


def skip_unless_available():
    ok, why = netns.available()
    if not ok:
        raise unittest.SkipTest(why)


class NetworkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_available()
        cls.net = netns.Network(3)
        cls.addClassCleanup(cls.net.close)  # even if the rest of setUpClass fails
        cls.servers = [cls.net.popen(i, [PY, "-c", SERVER, str(PORT), "60"]) for i in (1, 2)]
        for i in (1, 2):
            cls.net.wait_port(i, PORT, timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.net.close()
        cls.net.close()  # idempotent
        assert not leftovers(cls.net.prefix), leftovers(cls.net.prefix)
        assert not any(alive(p.pid) for p in cls.servers)

    def talk(self, src, dst, mode="echo"):
        """One exchange from host src (None: this, the root, namespace) with
        the server in host dst."""
        args = ["-c", CLIENT, self.net.hosts[dst].ip, str(PORT), mode]
        if src is None:
            r = subprocess.run([PY] + args, capture_output=True, text=True, timeout=30)
        else:
            r = self.net.run(src, [PY] + args, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_hosts_reach_each_other_and_the_root_leg(self):
        self.assertEqual(self.talk(0, 1)["result"], "ok")
        self.assertEqual(self.talk(None, 1)["result"], "ok")
        self.assertEqual(self.talk(2, 1)["result"], "ok")
        self.assertIn(ipaddress.ip_address(self.net.root_ip), self.net.subnet)

    def test_each_host_has_its_own_host_name(self):
        machine = socket.gethostname()
        for i, host in enumerate(self.net.hosts):
            self.assertEqual(self.net.run(i, ["hostname"]).stdout.strip(), host.hostname)
            self.assertNotEqual(host.hostname, machine)
        self.assertEqual(self.net.run(0, ["hostname"], hostname="other").stdout.strip(), "other")
        self.assertEqual(socket.gethostname(), machine)

    def test_link_down_partitions_a_host_until_link_up(self):
        # A connection from the root leg, open across the partition.
        c = socket.create_connection((self.net.hosts[1].ip, PORT), timeout=1)
        self.addCleanup(c.close)
        c.sendall(b"before\n")
        self.assertEqual(c.recv(100), b"before\n")
        self.net.link_down(1)
        try:
            t0 = time.monotonic()
            self.assertEqual(self.talk(0, 1)["result"], "timeout")  # not refused
            self.assertEqual(self.talk(1, 2)["result"], "timeout")  # nor unreachable
            self.assertLess(time.monotonic() - t0, 5)
            self.assertEqual(self.talk(0, 2)["result"], "ok")  # the rest still talk
            c.sendall(b"during\n")
            c.settimeout(0.5)
            self.assertRaises(socket.timeout, c.recv, 100)  # stalls, isn't reset
        finally:
            self.net.link_up(1)
        # TCP retransmits what the partition dropped, and the old connection resumes.
        c.settimeout(10)
        self.assertEqual(c.recv(100), b"during\n")
        self.assertEqual(self.talk(0, 1)["result"], "ok")

    def test_shape_limits_both_directions_until_cleared(self):
        size = 2 << 20
        fast = [self.talk(0, 1, "get%d" % size), self.talk(0, 1, "put%d" % size)]
        self.net.shape(1, rate="20mbit")
        try:
            slow = [self.talk(0, 1, "get%d" % size), self.talk(0, 1, "put%d" % size)]
        finally:
            self.net.shape(1)
        again = self.talk(0, 1, "get%d" % size)
        print("\n2 MB from/to h1: unshaped %.3f/%.3f s, at 20mbit %.3f/%.3f s, cleared %.3f s" % (
            fast[0]["seconds"], fast[1]["seconds"], slow[0]["seconds"], slow[1]["seconds"],
            again["seconds"]), file=sys.stderr)
        for r in fast + slow + [again]:
            self.assertEqual(r["result"], "ok", r)
        for r in fast + [again]:
            self.assertLess(r["seconds"], 0.3)
        for r in slow:  # 16 Mbit at 20 Mbit/s: about 0.8 s
            self.assertGreater(r["seconds"], 0.5)
        self.assertRaises(ValueError, self.net.shape, 1, rate="fast")

    def test_delay_adds_to_the_round_trip(self):
        ok, why = self.net.netem_available()
        if not ok:
            self.assertRaises(RuntimeError, self.net.shape, 1, delay="10ms")
            self.skipTest(why)
        base = self.talk(0, 1)["seconds"]
        self.net.shape(1, delay="50ms")
        try:
            # Connect and one echo: two round trips through h1's link, 100 ms each.
            slow = self.talk(0, 1)["seconds"]
        finally:
            self.net.shape(1)
        print("\necho h0->h1: %.3f s, with 50ms each way %.3f s" % (base, slow), file=sys.stderr)
        self.assertGreater(slow, 0.2)
        self.assertLess(base, 0.1)


class CleanupTest(unittest.TestCase):
    """Nothing outlives a Network: not its namespaces, links or processes,
    including ones that left the process group we started."""

    @classmethod
    def setUpClass(cls):
        skip_unless_available()

    def start_sleepers(self, net):
        p = net.popen(0, SLEEPERS, stdout=subprocess.PIPE, text=True)
        pids = [p.pid, int(p.stdout.readline())]
        p.stdout.close()
        self.assertTrue(all(alive(pid) for pid in pids))
        return pids

    def assert_gone(self, prefix, pids):
        self.assertEqual(leftovers(prefix), [])
        self.assertEqual([pid for pid in pids if alive(pid)], [])

    def test_exception_and_ctrl_c_inside_with(self):
        for error in (RuntimeError, SimulatedCtrlC):
            with self.assertRaises(error):
                with netns.Network(2) as net:
                    pids = self.start_sleepers(net)
                    self.assertEqual(len(leftovers(net.prefix)), 4)  # h0, h1, sw, root leg
                    raise error("simulated failure")
            self.assert_gone(net.prefix, pids)

    @contextlib.contextmanager
    def child(self, how):
        """A child test run, stopped on the way out whatever happens here
        (the test's cleanups don't run on a KeyboardInterrupt)."""
        p = subprocess.Popen([PY, "-c", CHILD, how, os.path.dirname(os.path.abspath(__file__)),
                              json.dumps(SLEEPERS)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            # Its pipes stay open in the sleepers it started: read a line, not to EOF.
            made = json.loads(p.stdout.readline() or "{}")
            self.assertIn("prefix", made, p.stderr.read() if p.poll() is not None else "")
            self.assertTrue(leftovers(made["prefix"]))
            yield p, made
        finally:
            # EOF on its stdin ends it cleanly; a signal might come before
            # it has a handler (or while its parent's SIGINT is ignored).
            p.stdin.close()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                netns.remove_stale()
            p.stdout.close()
            p.stderr.close()

    def test_sigint_and_atexit_in_a_child_run(self):
        with self.child("sigint") as (p, made):
            p.send_signal(signal.SIGINT)
            p.wait(timeout=20)
            self.assert_gone(made["prefix"], made["pids"])
        with self.child("atexit") as (p, made):
            self.assertEqual(p.wait(timeout=20), 0)
            self.assert_gone(made["prefix"], made["pids"])

    def test_next_run_removes_what_a_killed_run_left(self):
        try:
            # Locked, so that a parallel run's Network() can't clear it yet.
            with self.child("sigkill") as (p, made), netns._lock():
                p.kill()
                p.wait(timeout=20)
                # Killed before any cleanup: all still there, processes too.
                self.assertEqual(len(leftovers(made["prefix"])), 4)
                self.assertTrue(all(alive(pid) for pid in made["pids"]))
            with netns.Network(1) as net:  # any new Network clears dead runs' leftovers
                self.assert_gone(made["prefix"], made["pids"])
                self.assertTrue(leftovers(net.prefix))
        finally:
            netns.remove_stale()  # if this test failed or was interrupted


if __name__ == "__main__":
    # A harness may stop a run with SIGTERM: unwind as from Ctrl-C, so the
    # Networks close (a SystemExit would only fail the test and go on).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    unittest.main(verbosity=2)
