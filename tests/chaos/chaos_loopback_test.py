#!/usr/bin/python3
"""Faults caused for real on loopback: kill -9 of random workers at random
steps, a stopped worker (evicted, then back as new), a hung training thread
(heartbeats go on; evicted as hung), a killed and restarted coordinator, the
whole job killed and resumed from its checkpoint, a worker joining
mid-job, and a kill under PowerSGD. Every run ends with chaos.check_run."""
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "py"))
import chaos  # noqa: E402
from chaos import ChaosRun, chaos_job, check_run  # noqa: E402
from harness import wait_for  # noqa: E402


class LoopbackChaosTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rng = chaos.seeded_rng()
        cls.job = chaos_job("chaos")
        cls.baseline = chaos.baseline(cls.job)
        print("undisturbed accuracy %.4f" % cls.baseline, flush=True)

    def run_job(self, job=None, workers=3):
        run = ChaosRun(job or self.job, workers)
        self.addCleanup(run.close)
        run.wait_state("JOB_STATE_RUNNING", 60)
        return run

    def test_kill9_random_workers(self):
        run = self.run_job()
        for round_ in range(3):
            run.wait_step_past(run.step() + self.rng.randrange(30, 120))
            victim = chaos.pick(self.rng, run.members())
            generation = run.generation()
            print("round %d: kill -9 %s at step %d" % (round_, victim, run.step()), flush=True)
            run.kill(victim)
            # The survivors go on without it...
            run.wait_generation_past(generation, timeout=20)
            # ...and it comes back, as a new worker, at the next re-form.
            run.start_worker(int(victim[1:]))
        final = run.finish()
        causes = [c["cause"] for c in final["generation_changes"]]
        self.assertEqual(causes.count("CHANGE_CAUSE_LOST"), 3, causes)
        check_run(self, run, final, self.baseline)

    def test_stopped_worker_evicted_then_rejoins(self):
        run = self.run_job()
        run.wait_step_past(80)
        generation = run.generation()
        run.signal("w1", signal.SIGSTOP)
        run.wait_generation_past(generation, timeout=20)  # heartbeat timeout 2 s
        self.assertNotIn("w1", run.members())
        run.signal("w1", signal.SIGCONT)
        # Back as new: admitted at the next step boundary, state from a peer.
        wait_for(lambda: "w1" in run.members(), 30, "w1 to rejoin")
        final = run.finish()
        check_run(self, run, final, self.baseline)

    def test_hung_training_thread_evicted(self):
        run = self.run_job()
        run.wait_step_past(80)
        generation = run.generation()
        open(run.hang_file(2), "w").close()  # w2 stalls; its heartbeats go on
        run.wait_generation_past(generation, timeout=30)
        final_change = run.status()["generation_changes"][-1]
        self.assertEqual(final_change["cause"], "CHANGE_CAUSE_HUNG", final_change)
        self.assertIn("w2", final_change["reason"])
        self.assertIn("data", final_change["reason"])  # the phase it was stuck in
        os.remove(run.hang_file(2))
        wait_for(lambda: "w2" in run.members(), 30, "w2 to rejoin")
        final = run.finish()
        check_run(self, run, final, self.baseline)

    def test_coordinator_killed_and_restarted_training_never_stops(self):
        run = self.run_job()
        run.wait_step_past(100)
        generation = run.generation()
        run.kill("coordinator")
        killed_at = time.time()
        time.sleep(1.5)  # an outage: workers train on without it
        run.start_coordinator()
        # (The job may even finish right after: it is short.)
        wait_for(
            lambda: any(c["cause"] == "CHANGE_CAUSE_ADOPTED"
                        for c in run.status().get("generation_changes", [])), 30,
            "the restarted coordinator to adopt the generation")
        self.assertEqual(run.generation(), generation)  # adopted, not re-formed
        # Steps completed while the coordinator was down.
        during = [m for m in run.metrics("w0") if killed_at < m["time"] < killed_at + 1.5]
        self.assertGreater(len(during), 10, "w0 stopped training during the outage")
        final = run.finish()
        check_run(self, run, final, self.baseline)

    def test_everything_killed_resumes_from_checkpoint(self):
        folder = tempfile.mkdtemp(prefix="ddp-chaos-ckpt-")
        self.addCleanup(shutil.rmtree, folder, True)
        job = chaos_job("chaos-ckpt", checkpoint={"dir": folder, "everySteps": 50, "keep": 2})
        base = chaos.baseline(dict(job, checkpoint={"dir": folder + "-base", "everySteps": 50,
                                                    "keep": 2}))
        run = self.run_job(job)
        run.wait_step_past(self.rng.randrange(220, 380))
        # All at once, the coordinator first: nobody gets to react.
        for name in ["coordinator", "w0", "w1", "w2"]:
            run.signal(name, signal.SIGKILL)
        for name in ["coordinator", "w0", "w1", "w2"]:
            run.procs[name].wait(timeout=10)
        killed_step = max(m["step"] for n in ("w0", "w1", "w2") for m in run.metrics(n))
        run.start_coordinator()
        for i in range(3):
            run.start_worker(i)
        final = run.finish()
        resumed = [c for c in final["generation_changes"]
                   if c.get("state_source") == "STATE_SOURCE_CHECKPOINT"]
        self.assertEqual(len(resumed), 1, final["generation_changes"])
        resume_step = int(resumed[0].get("resume_step", 0))
        self.assertGreater(resume_step, 0)
        self.assertLessEqual(killed_step - resume_step, 50)
        check_run(self, run, final, base, max_steps_lost=50)

    def test_powersgd_state_starts_over_together_after_a_kill(self):
        """PowerSGD's state (each rank's error, the factors, its step count)
        lasts one generation: after a kill and a rejoin, every rank starts it
        over together, so the replicas stay equal (the coordinator compares
        their digests at each epoch's end) and the job trains as well as
        undisturbed."""
        job = chaos_job("chaos-powersgd", compression="powersgd", powersgdRank=4,
                        powersgdStartStep=10)
        baseline = chaos.baseline(job)
        run = self.run_job(job)
        run.wait_step_past(100)
        generation = run.generation()
        victim = chaos.pick(self.rng, run.members())
        run.kill(victim)
        run.wait_generation_past(generation, timeout=20)
        run.start_worker(int(victim[1:]))
        final = run.finish()
        self.assertGreaterEqual(len(final.get("generation_changes", [])), 2)
        check_run(self, run, final, baseline)

    def test_worker_joins_mid_job(self):
        run = self.run_job(chaos_job("chaos-join", maxWorkers=3, settleSeconds=0), workers=2)
        run.wait_step_past(60)
        self.assertEqual(len(run.members()), 2)
        run.start_worker(2)
        wait_for(lambda: len(run.members()) == 3, 30, "the third worker to join")
        change = run.status()["generation_changes"][-1]
        self.assertEqual(change["cause"], "CHANGE_CAUSE_JOINED")
        self.assertEqual(change.get("joined"), ["w2"])
        self.assertEqual(int(change.get("steps_lost", 0)), 0)
        final = run.finish()
        check_run(self, run, final, self.baseline)


if __name__ == "__main__":
    unittest.main(verbosity=2)
