#!/usr/bin/python3
"""Faults across separate test hosts: the coordinator and three workers each
in a network namespace of their own (own address, own host name, so "auto"
picks Gloo over TCP), joined by veth links through a bridge. A worker's link
goes down for longer than the heartbeat timeout (a partition) and comes
back; a worker on another host is killed with kill -9. Skipped where
namespaces can't be made (CI runs as root and can)."""
import os
import signal
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "py"))
import chaos  # noqa: E402
import netns  # noqa: E402
from chaos import ChaosRun, chaos_job, check_run  # noqa: E402
from harness import wait_for  # noqa: E402


class NetnsChaosTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ok, why = netns.available()
        if not ok:
            raise unittest.SkipTest(why)
        cls.rng = chaos.seeded_rng()
        cls.job = chaos_job("netns-chaos")
        cls.baseline = chaos.baseline(cls.job)

    def start(self):
        net = netns.Network(4)
        self.addCleanup(net.close)
        run = ChaosRun(self.job, 3, net=net)
        self.addCleanup(run.close)
        run.wait_state("JOB_STATE_RUNNING", 60)
        run.wait_step_past(0)
        for w in run.status()["workers"]:
            self.assertEqual(w["probe"]["backend"], "gloo", w)  # hosts apart: TCP
        return net, run

    def test_partition_longer_than_heartbeat_timeout(self):
        net, run = self.start()
        run.wait_step_past(self.rng.randrange(60, 200))
        generation = run.generation()
        cut = chaos.pick(self.rng, run.members())
        host = int(cut[1:]) + 1
        run.events.append((time.time(), "link down " + cut))
        net.link_down(host)
        t0 = time.time()
        run.wait_generation_past(generation, timeout=30)
        print("partitioned %s: training resumed without it after %.1fs" % (cut, time.time() - t0),
              flush=True)
        self.assertNotIn(cut, run.members())
        time.sleep(max(0, 4 - (time.time() - t0)))
        net.link_up(host)
        run.events.append((time.time(), "link up " + cut))
        # Back as new once its stale connections fail: admitted again.
        wait_for(lambda: cut in run.members(), 60, cut + " to rejoin", interval=0.2)
        final = run.finish()
        check_run(self, run, final, self.baseline)

    def test_kill9_across_hosts(self):
        net, run = self.start()
        for _ in range(2):
            run.wait_step_past(run.step() + self.rng.randrange(40, 150))
            victim = chaos.pick(self.rng, run.members())
            generation = run.generation()
            run.kill(victim)
            run.wait_generation_past(generation, timeout=20)
            run.start_worker(int(victim[1:]))
        final = run.finish()
        check_run(self, run, final, self.baseline)


if __name__ == "__main__":
    # A SIGTERM from ctest's timeout still tears the namespaces down.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    unittest.main(verbosity=2)
