#!/usr/bin/python3
"""Faults caused for real on loopback: kill -9 of random workers at random
steps, a stopped worker (evicted, then back as new), a hung training thread
(heartbeats go on; evicted as hung), a killed and restarted coordinator, a
stopped coordinator, the whole job killed and resumed from its checkpoint, a
worker joining mid-job, a kill during a join, rank 0 killed after the last
step, an evaluation longer than the hang threshold, and a kill under
PowerSGD. Every run ends with chaos.check_run, or its invariants where the
data is not Fashion-MNIST."""
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
        victims = []
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
            victims.append(victim)
        final = run.finish()
        # Each kill ended a generation: seen as the lost stream, or first as
        # a survivor's failed collective, whichever the coordinator heard
        # first; either way the victim is named among those who left.
        changes = final["generation_changes"]
        faults = [c for c in changes if c["cause"] in ("CHANGE_CAUSE_LOST", "CHANGE_CAUSE_FAILED")]
        self.assertGreaterEqual(len(faults), 3, [c["cause"] for c in changes])
        for victim in victims:
            self.assertTrue(any(victim in c.get("left", []) for c in faults), (victim, faults))
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
        self.assertEqual(resume_step % 50, 0)  # a checkpoint's step
        # Checkpoints are written behind training: the one begun at the
        # last multiple of 50 may not be complete when everything dies (a
        # clean clone's CI run lost 52 steps so), but the one before it is.
        self.assertLess(killed_step - resume_step, 100)
        check_run(self, run, final, base, max_steps_lost=100)

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

    def test_stopped_coordinator_reforms_nothing(self):
        """A coordinator frozen for twice the heartbeat timeout (SIGSTOP: a
        paused VM, a swap storm) then thawed: the workers train on meanwhile,
        and it counts none of them lost for its own silence."""
        run = self.run_job()
        run.wait_step_past(80)
        generation = run.generation()
        changes = len(run.status()["generation_changes"])
        run.signal("coordinator", signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(4.0)  # the chaos runs' heartbeat timeout is 2 s
        run.signal("coordinator", signal.SIGCONT)
        time.sleep(3.0)  # past a sweep or two after the thaw
        status = run.status()
        self.assertEqual(int(status["generation"]), generation, status["generation_changes"][-1])
        self.assertEqual(len(status["generation_changes"]), changes, status["generation_changes"])
        during = [m for m in run.metrics("w0") if stopped_at < m["time"] < stopped_at + 4.0]
        self.assertGreater(len(during), 10, "w0 stopped training while the coordinator was")
        final = run.finish()
        self.assertEqual(len(final["generation_changes"]), changes)
        check_run(self, run, final, self.baseline)

    def test_kill_during_a_join_reforms_without_the_joiner(self):
        """A worker restarted after a kill builds its state before it is
        admitted (it was asked to prepare), so a member killed right after
        the join generation formed re-forms the job at once."""
        run = self.run_job(chaos_job("chaos-join-kill", settleSeconds=0))
        run.wait_step_past(60)
        generation = run.generation()
        run.kill("w2")
        run.wait_generation_past(generation, timeout=20)
        joined_at = run.generation()
        run.start_worker(2)
        wait_for(lambda: run.generation() > joined_at and "w2" in run.members(), 30,
                 "w2 to be admitted")
        join_generation = run.generation()
        run.kill("w1")  # at once: the join generation is just forming
        run.wait_generation_past(join_generation, timeout=20)
        # The restarted w2 (its log's last start) had its state before its
        # first assignment.
        log = open(os.path.join(run.dir, "w2.log")).read()
        log = log[log.rindex("] device cpu:2"):]
        self.assertLess(log.index("prepared job"), log.index("joined generation"), log[-2000:])
        run.start_worker(1)
        final = run.finish()
        check_run(self, run, final, self.baseline)


class EvaluationChaosTest(unittest.TestCase):
    """Evaluations longer than the hang threshold, and one lost with rank 0
    after the job's last step. A CNN on a synthetic problem with a large test
    set makes each evaluation take seconds while a step takes milliseconds."""

    @staticmethod
    def job(name, **overrides):
        job = chaos_job(name, model={"kind": "cnn"},
                        dataset={"kind": "synthetic", "trainSize": 12000, "testSize": 20000},
                        epochs=3, minWorkers=2, maxWorkers=3, hangTimeoutSeconds=1)
        job.update(overrides)
        return job

    def run_job(self, job):
        run = ChaosRun(job, 3)
        self.addCleanup(run.close)
        run.wait_state("JOB_STATE_RUNNING", 60)
        return run

    def check_ended(self, run, final):
        """What check_run asks, but the accuracy (no baseline on this data)."""
        self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final.get("message"))
        chaos.coverage.check(run.index_lines(), 12000, 3)
        epochs = [int(e.get("epoch", 0)) for e in final.get("epoch_results", [])]
        self.assertEqual(epochs, [0, 1, 2], "every epoch has its evaluation")
        self.assertEqual(final["test_accuracy"], final["epoch_results"][-1]["test_accuracy"])
        run.close()
        self.assertEqual(run.crashed(), [], "processes that crashed")
        alive, segments = run.leftovers()
        self.assertEqual(alive, [], "processes left behind")
        self.assertEqual(segments, [], "/dev/shm segments left behind")

    def test_evaluation_longer_than_the_hang_threshold_is_no_hang(self):
        # Twice the usual test set: each evaluation must outlast the hang
        # threshold on a fast machine too (20000 took 0.9 s on one).
        run = self.run_job(self.job("chaos-eval", dataset={
            "kind": "synthetic", "trainSize": 12000, "testSize": 40000}))
        final = run.finish()
        causes = [c["cause"] for c in final["generation_changes"]]
        self.assertEqual(causes, ["CHANGE_CAUSE_START"], final["generation_changes"])
        # It was a test: the evaluations outlasted the hang threshold (1 s;
        # 10 median steps are far less). An epoch's evaluation is the gap
        # between its last step and the next epoch's first.
        records = run.metrics("w0")
        gaps = [b["time"] - a["time"] for a, b in zip(records, records[1:])
                if b["epoch"] == a["epoch"] + 1]
        print("evaluation gaps %s s" % ["%.2f" % g for g in gaps], flush=True)
        self.assertGreater(max(gaps), 1.0)
        self.check_ended(run, final)

    def test_rank0_killed_after_the_last_step_final_model_still_evaluated(self):
        run = self.run_job(self.job("chaos-eval-last"))
        total = wait_for(lambda: int(run.status().get("total_steps", 0)), 30, "total steps")
        # The last step is committed; every rank now evaluates the final
        # model for seconds. Rank 0 (w0) dies in the middle of it.
        wait_for(lambda: run.step() >= total, 120, "the last step", interval=0.02)
        killed_generation = run.generation()
        run.kill("w0")
        final = run.finish()
        last = final["epoch_results"][-1]
        print("last epoch evaluated in generation %s (rank 0 killed in %d)" % (
            last.get("generation"), killed_generation), flush=True)
        if int(last.get("generation", 0)) == killed_generation:
            print("(the kill came after the evaluation reached the coordinator)", flush=True)
        self.check_ended(run, final)


if __name__ == "__main__":
    unittest.main(verbosity=2)
