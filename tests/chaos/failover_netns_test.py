#!/usr/bin/python3
"""The leader cut off from etcd, not from the workers: a 3-member etcd on one
test host, two coordinators and three workers each on a host of their own
(network namespaces joined by a bridge). The leader's path to etcd goes
silent both ways while it still reaches the workers and they it; it must
stop leading within its lease's TTL, a standby must lead within TTL + 1 s,
training goes on; once the path is back, exactly one leads, the job
succeeds with every sample trained once per epoch, and etcd's revision
history shows no two terms overlapping in their writes. Skipped where
namespaces can't be made (CI runs as root and can)."""
import concurrent.futures
import os
import signal
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "py"))
import grpc  # noqa: E402

import coverage  # noqa: E402
import netns  # noqa: E402
from chaos import FASHION_MNIST_TRAIN, chaos_job  # noqa: E402
from etcd_cluster import EtcdCluster  # noqa: E402
from failover import FailoverRun, check_terms, etcd_history  # noqa: E402
from failover_test import longest_step_gap  # noqa: E402
from harness import wait_for  # noqa: E402

TTL = 2  # seconds: the default --lease_ttl
# Host 0 etcd (three members), hosts 1-3 workers w0-w2 (ChaosRun's), hosts 4-5 c0, c1.
HOSTS = ["etcd", "w0", "w1", "w2", "c0", "c1"]
CUT_SECONDS = 3 * TTL  # how long the leader stays cut off: past its lease, and a retry or two


class FailoverNetnsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ok, why = netns.available()
        if not ok:
            raise unittest.SkipTest(why)

    def start(self):
        net = netns.Network(HOSTS)
        self.addCleanup(net.close)
        etcd = EtcdCluster(3, net=net, hosts=[0])
        self.addCleanup(etcd.close)
        run = FailoverRun(chaos_job("failover-netns", epochs=5), etcd, coordinators=2, workers=3,
                          lease_ttl=TTL, net=net)
        self.addCleanup(run.close)
        run.wait_state("JOB_STATE_RUNNING", 60)
        run.wait_step_past(40)
        return net, etcd, run

    def test_leader_cut_from_etcd_steps_down_a_standby_leads_one_leader_after_heal(self):
        _, etcd, run = self.start()
        old = run.leader()
        new = 1 - old
        t = time.time()
        run.cut_from_etcd(old)
        # Both clocks at once: the old leader refusing, the standby leading.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            refused = pool.submit(first_refusal, run, old, TTL + 5)
            led = pool.submit(run.wait_leader, new, TTL + 5)
            refused_at, refusal = refused.result()
            led_at = led.result()
        print("c%d cut from etcd: it stopped leading %.2fs later (%s: %s); c%d led %.2fs later" % (
            old, refused_at - t, refusal[0].name, refusal[1], new, led_at - t), flush=True)
        self.assertLess(refused_at - t, TTL, "the cut leader stopped leading within the TTL")
        self.assertLess(led_at - t, TTL + 1.0, "a standby led within the TTL and a second")
        # It says why, and executes itself again as a standby, which can't
        # know the leader (it can't read etcd).
        lost, listened = wait_for(lambda: reexecuted(run, old), 5,
                                  "c%d to log that it lost leadership and listens again" % old,
                                  interval=0.05)
        refusal = standby_refusal(run, old, 5)
        print("c%d logged the loss %.2fs after the cut and listened again as a standby %.3fs "
              "later; it refuses: %s" % (old, lost - t, listened - lost, refusal[1]), flush=True)
        # Training goes on under the new leader while the old one is cut off.
        step = run.step()
        run.wait_step_past(step + 50, 20)
        self.assertEqual(run.leader(), new)
        time.sleep(max(0.0, t + CUT_SECONDS - time.time()))
        healed = time.time()
        print("at the heal: %s, step %d" % (run.status().get("state"), run.step()), flush=True)
        run.heal_from_etcd(old)
        run.wait_refusal_naming(old, run.addresses[new], timeout=20)
        print("healed after %.1fs; c%d named c%d the leader %.2fs later" % (
            healed - t, old, new, time.time() - healed), flush=True)
        self.assert_one_leader(run, new)
        final = run.finish(240)
        self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final.get("message"))
        self.assert_one_leader(run, new)
        coverage.check(run.index_lines(), FASHION_MNIST_TRAIN, int(run.job["epochs"]))
        for change in final.get("generation_changes", []):
            self.assertEqual(int(change.get("steps_lost", 0)), 0, change)
            if float(change.get("at_unix_seconds", 0)) > t:
                print("after the cut: %s" % change, flush=True)
        gap = longest_step_gap(run, t)
        print("longest gap between steps after the cut: %.3fs" % gap, flush=True)
        self.assertLess(gap, 1.0)
        terms, problems = check_terms(etcd_history(etcd.endpoints, run.prefix), run.prefix)
        print("terms (lease, first write, last write, writes): %s" % terms, flush=True)
        self.assertEqual(problems, [])
        self.assertGreaterEqual(len(terms), 2, "a second term wrote")
        run.close()
        self.assertEqual(run.crashed(), [], "processes that crashed")

    def assert_one_leader(self, run, leader):
        """Every coordinator's GetStatus (standbys forward it) names
        `leader`, only `leader` says it leads itself, and every other one
        refuses a mutation naming it."""
        address = run.addresses[leader]
        for i in range(len(run.addresses)):
            own = wait_for(lambda: run.leadership_of(i), 10, "c%d to answer GetStatus" % i,
                           interval=0.1)
            self.assertEqual(own.get("leader"), address, (i, own))
            leads_itself = own.get("is_leader") and own.get("this_coordinator") == run.addresses[i]
            self.assertEqual(bool(leads_itself), i == leader, (i, own))
            if i != leader:
                code, details, trailer = run.refusal(i)
                self.assertEqual((code, trailer), (grpc.StatusCode.UNAVAILABLE, address), details)


def first_refusal(run, i, timeout):
    """(when, (code, details, trailer)) c<i> first answered a mutation
    UNAVAILABLE: its own refusal as a leader whose lease may have lapsed, or,
    if that window (up to 0.1 s) fell between two tries, its port closing as
    it executes itself again."""
    found = []

    def refuses():
        r = run.refusal(i)
        if r[0] == grpc.StatusCode.UNAVAILABLE:
            found.append((time.time(), r))
        return found

    wait_for(refuses, timeout, "c%d to refuse" % i, interval=0.02)
    return found[0]


def standby_refusal(run, i, timeout):
    """c<i>'s refusal of a mutation as a coordinator that is not the leader
    (not a connection's failure)."""
    def refuses():
        r = run.refusal(i)
        if r[0] == grpc.StatusCode.UNAVAILABLE and "not the leader" in r[1]:
            return r
        # A fresh channel next time: this one may be backing off after the
        # port closed for the execution.
        run.clients.pop(i).close()
        return None

    return wait_for(refuses, timeout, "c%d to refuse as a standby" % i, interval=0.05)


def reexecuted(run, i):
    """(when c<i> logged that it lost leadership, when it next logged that
    it listens as a standby), or None before both."""
    lost = log_times(run.log("c%d" % i), "no longer the leader")
    if not lost:
        return None
    again = [s for s in log_times(run.log("c%d" % i), "standby on port") if s >= lost[0]]
    return (lost[0], again[0]) if again else None


def log_times(text, needle):
    """The times (Unix seconds) of the log lines holding `needle`: lines
    begin "2026-12-02 06:34:23.442 W coordinator] ...", in local time."""
    times = []
    for line in text.splitlines():
        if needle in line:
            stamp, millis = line[:23].split(".")
            times.append(time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) +
                         int(millis) / 1000)
    return times


if __name__ == "__main__":
    # A SIGTERM from ctest's timeout still tears the namespaces down.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    unittest.main(verbosity=2)
