#!/usr/bin/python3
"""The control plane keeps its word, with real processes: a job a client was
told is submitted (or cancelled) survives a kill -9 right after the answer;
a second coordinator on the same port or the same state folder is refused,
naming the first; jobs that ended are kept (ListJobs, GetJob, GetStatus
answer for them after a restart, with their timestamps), and a coordinator
restarted with its --job after another job ran does not run it again."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from cluster import ROOT_FLAGS, Cluster, synthetic_job  # noqa: E402
from harness import BIN, free_port  # noqa: E402

C = "ddp.v1.Coordinator/"


def submit(cluster, job):
    return cluster.client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(job), timeout=60)


def listed(cluster):
    return {j["job_id"]: j for j in cluster.client.call(C + "ListJobs")["jobs"]}


def kill_hard(cluster):
    """kill -9 of the coordinator: nothing is flushed or said."""
    cluster.coordinator.send_signal(signal.SIGKILL)
    cluster.coordinator.wait(timeout=10)


class AcknowledgedMeansDurableTest(unittest.TestCase):
    def test_jobs_acknowledged_then_a_kill_are_all_there_after_a_restart(self):
        state = tempfile.mkdtemp(prefix="ddp-state-")
        flags = ["--state_dir=" + state]
        c = Cluster(extra_flags=flags)
        try:
            c.start_worker(0)
            # The first holds the pool (it trains long): the others queue.
            self.assertIn(submit(c, synthetic_job("first", 1, epochs=50))["state"],
                          ("JOB_STATE_WAITING", "JOB_STATE_RUNNING"))
            names = ["queued-%d" % i for i in range(3)]
            for name in names:
                self.assertEqual(submit(c, synthetic_job(name, 1))["state"], "JOB_STATE_QUEUED")
            c.client.call(C + "CancelJob", '{"job_id": "queued-1", "reason": "not needed"}')
            kill_hard(c)  # at once: nothing more is written
        finally:
            c.stop()
        again = Cluster(extra_flags=flags)
        try:
            jobs = listed(again)
            self.assertEqual(set(jobs), {"first", "queued-0", "queued-1", "queued-2"}, jobs)
            self.assertEqual(jobs["queued-1"]["state"], "JOB_STATE_CANCELLED")
            self.assertIn("not needed", jobs["queued-1"]["message"])
            self.assertEqual(jobs["queued-0"]["state"], "JOB_STATE_QUEUED")
        finally:
            again.stop()


class OneCoordinatorTest(unittest.TestCase):
    def run_second(self, *flags):
        return subprocess.run([os.path.join(BIN, "ddp-coordinator"), "--metrics_listen=",
                               "--http_listen="] + ROOT_FLAGS + list(flags),
                              capture_output=True, text=True, timeout=60)

    def test_a_second_coordinator_on_the_same_port_is_refused_naming_the_first(self):
        c = Cluster()
        try:
            second = self.run_second("--listen=127.0.0.1:%d" % c.port)
            self.assertNotEqual(second.returncode, 0, second.stderr)
            self.assertIn("port %d is in use by pid %d (ddp-coordinator)" % (
                c.port, c.coordinator.pid), second.stderr)
            # Every worker started afterwards reaches the one coordinator.
            for i in range(4):
                c.start_worker(i)
            c.wait_for(lambda: c.status().get("attached_workers") == 4, 60,
                       "four workers attached to the first coordinator")
        finally:
            c.stop()

    def test_a_second_coordinator_on_the_same_state_folder_is_refused_naming_the_first(self):
        state = tempfile.mkdtemp(prefix="ddp-state-")
        c = Cluster(extra_flags=["--state_dir=" + state])
        try:
            second = self.run_second("--listen=127.0.0.1:0", "--state_dir=" + state)
            self.assertNotEqual(second.returncode, 0, second.stderr)
            self.assertIn("in use by another coordinator (pid %d)" % c.coordinator.pid,
                          second.stderr)
            self.assertEqual(c.status().get("state", "JOB_STATE_UNSPECIFIED"),
                             "JOB_STATE_UNSPECIFIED")  # the first one serves on, untouched
        finally:
            c.stop()
        # Once the first is gone, the folder is free.
        again = Cluster(extra_flags=["--state_dir=" + state])
        again.stop()


class HistoryTest(unittest.TestCase):
    def test_ended_jobs_survive_a_restart_and_the_first_job_is_not_run_again(self):
        state = tempfile.mkdtemp(prefix="ddp-state-")
        first = synthetic_job("first", 1, maxSteps=10)
        flags = ["--state_dir=" + state]
        c = Cluster(job=first, extra_flags=flags)
        try:
            c.start_worker(0)
            c.wait_state("JOB_STATE_SUCCEEDED")
            submit(c, synthetic_job("second", 1, maxSteps=10))
            c.wait_for(lambda: listed(c)["second"]["state"] == "JOB_STATE_SUCCEEDED", 120,
                       "the second job to succeed")
            before = listed(c)
        finally:
            c.stop()
        time.sleep(1.5)  # ages must count from the submission, not the restart
        again = Cluster(job=first, extra_flags=flags)  # the same --job, as a unit restarts it
        try:
            again.start_worker(0)
            jobs = listed(again)
            self.assertEqual(list(jobs), ["first", "second"])
            for name in ("first", "second"):
                job = jobs[name]
                self.assertEqual(job["state"], "JOB_STATE_SUCCEEDED", job)
                for field in ("submitted_at", "started_at", "ended_at", "global_step",
                              "generation"):
                    self.assertEqual(job[field], before[name][field], (name, field))
                self.assertGreater(job["age_seconds"], before[name]["age_seconds"] + 1.0)
                status = again.client.call(C + "GetStatus", '{"job_id": "%s"}' % name)
                self.assertEqual(status["state"], "JOB_STATE_SUCCEEDED")
                self.assertEqual(status["generation"], before[name]["generation"])
                self.assertEqual(status["submitted_at"], before[name]["submitted_at"])
                self.assertEqual(again.client.call(C + "GetJob", '{"job_id": "%s"}' % name)[
                    "state"], "JOB_STATE_SUCCEEDED")
            # The restarted --job is not run again: the worker stays free.
            time.sleep(2)
            self.assertNotIn("joined generation", again.log("w0"))
            self.assertNotIn("preparing job", again.log("w0"))
            self.assertEqual(listed(again)["first"]["generation"], before["first"]["generation"])
            self.assertIn("not run again", again.log("coordinator"))
        finally:
            again.stop()
        # The same name with another spec is refused, as for a job held whole.
        path = os.path.join(again.dir, "other.json")
        with open(path, "w") as f:
            json.dump(dict(first, batchSize=16), f)
        result = subprocess.run([os.path.join(BIN, "ddp-coordinator"), "--listen=127.0.0.1:0",
                                 "--metrics_listen=", "--http_listen=", "--job=" + path] +
                                ROOT_FLAGS + flags, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("already ran", result.stderr)



class TakeoverTest(unittest.TestCase):
    def test_a_member_back_as_a_new_process_ends_the_adoption_at_once(self):
        # A worker is killed, then the coordinator before it could re-form;
        # the coordinator restarts, and so does the worker, as a new process.
        # Its generation can't go on: the survivors re-form at once, not
        # after --adopt_grace.
        state = tempfile.mkdtemp(prefix="ddp-state-")
        port = free_port()
        flags = ["--state_dir=" + state, "--listen=127.0.0.1:%d" % port, "--adopt_grace=30s"]
        job = synthetic_job("adopt", 2, epochs=200)
        c = Cluster(job=job, extra_flags=flags)
        again = None
        try:
            workers = [c.start_worker(i) for i in range(2)]
            c.wait_for(lambda: int(c.status().get("global_step", 0)) > 20, 120, "the job to train")
            c.coordinator.send_signal(signal.SIGSTOP)  # it sees nothing of what follows
            workers[1].send_signal(signal.SIGKILL)
            workers[1].wait(timeout=10)
            kill_hard(c)
            again = Cluster(job=job, extra_flags=flags)
            restarted = time.time()
            again.start_worker(1)  # a new process, holding nothing
            again.wait_for(lambda: int(again.status().get("generation", 0)) > 1, 20,
                           "a new generation")
            took = time.time() - restarted
            self.assertLess(took, 10, "the adoption waited for a member that came back")
            status = again.status()
            self.assertIn("came back without it", json.dumps(status["generation_changes"]))
        finally:
            c.stop()
            if again is not None:
                again.stop()


if __name__ == "__main__":
    unittest.main()
