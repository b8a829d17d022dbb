#!/usr/bin/python3
"""Job code in a process of its own: each ddp-worker runs its job in a child
process (the worker binary again, `--job_process`; another waits, loaded,
for the next job), every thread of which is confined (seccomp, no_new_privs) while the daemon's own threads, which
hold the coordinator link, are not; and a job process that dies of a
segfault (as a model's native op would) is one rank lost: the survivors
re-form, the daemon lives on, starts a new process that joins again, and
the job ends with every sample trained once."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "chaos"))
import coverage  # noqa: E402
from cluster import Cluster, children_of, synthetic_job  # noqa: E402
from harness import thread_env  # noqa: E402

C = "ddp.v1.Coordinator/"
TRAIN = 8192


def job(name, **overrides):
    spec = synthetic_job(name, 2, epochs=6, seed=5, evaluate=False,
                         dataset={"kind": "synthetic", "trainSize": TRAIN, "testSize": 256},
                         rejoinTimeoutSeconds=2, reformMinIntervalSeconds=1)
    spec.update(overrides)
    return spec


def thread_status(pid):
    """{tid: {"Seccomp": ..., "NoNewPrivs": ...}} of every thread of `pid`."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        fields = {}
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("Seccomp", "NoNewPrivs"):
                        fields[key] = value.strip()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = fields
    return out


def start_workers(cluster, n, **env):
    workers = []
    for i in range(n):
        name = "w%d" % i
        args = cluster.worker_command(cluster.target, i, name, extra=[
            "--metrics_listen=", "--index_log=" + os.path.join(cluster.dir, name + ".idx.jsonl")])
        workers.append(cluster._start(name, args, env=thread_env(**env)))
    return workers


def steps(cluster):
    return int(cluster.status().get("global_step", 0) or 0)


class JobProcessTest(unittest.TestCase):
    def test_job_code_runs_confined_in_a_process_of_its_own_the_link_stays_outside(self):
        cluster = Cluster(job=job("isolated", epochs=8))
        try:
            workers = start_workers(cluster, 2)
            cluster.wait_for(lambda: steps(cluster) > 5, 120, "steps")
            for w in workers:
                # The job's process, and one launched ahead for the next job
                # (loaded, waiting for its job, running none).
                kids = children_of(w.pid)
                self.assertEqual(len(kids), 2, "the job's process and a spare: %s" % kids)
                status = {kid: thread_status(kid) for kid in kids}
                jobs = [kid for kid in kids if len(status[kid]) > 1]
                self.assertEqual(len(jobs), 1, status)
                kid = jobs[0]
                self.assertEqual(os.getpgid(kid), os.getpgid(w.pid),
                                 "in the daemon's group: a SIGSTOP of the group stops both")
                for tid, fields in status[kid].items():
                    self.assertEqual(fields, {"Seccomp": "2", "NoNewPrivs": "1"},
                                     "job process thread %d" % tid)
                daemon = thread_status(w.pid)
                self.assertTrue(all(f["Seccomp"] == "0" for f in daemon.values()),
                                "the daemon's threads (its link) are not the job's: %s" % daemon)
            cluster.wait_state("JOB_STATE_SUCCEEDED", 300)
            # The job's steps still reach the coordinator through the daemon.
            self.assertIn("finished", cluster.status().get("message", ""))
            for w in workers:
                self.assertIsNone(w.poll(), "the daemons live on after the job")
            self.assertGreater(len(cluster.metrics("w0")), 0, "step records written")
        finally:
            cluster.stop()

    def test_a_job_process_that_segfaults_loses_one_rank_and_the_job_goes_on(self):
        cluster = Cluster(job=job("crash"))
        try:
            # Rank 1's job process dies of SIGSEGV once it has committed
            # step 40 of generation 1 (whichever daemon holds rank 1).
            workers = start_workers(cluster, 2, DDP_TEST_JOB_PROCESS_CRASH="1:40")
            cluster.wait_state("JOB_STATE_SUCCEEDED", 300)
            for w in workers:
                self.assertIsNone(w.poll(), "no daemon died with its job process")
            crashed = [n for n in ("w0", "w1") if re.search(
                r"the process of job crash \(pid \d+\) killed by signal 11 \(Segmentation fault\)",
                cluster.log(n))]
            self.assertEqual(len(crashed), 1, "one job process crashed")
            log = cluster.log(crashed[0])
            self.assertIn("this rank of generation 1 is lost; the job goes on without it", log)
            # The same daemon started a new process for the job, which joined.
            started = re.findall(r"job crash runs in process (\d+)", log)
            self.assertEqual(len(set(started)), 2, started)
            lines = coverage.read_lines(os.path.join(cluster.dir, "*.idx.jsonl"))
            coverage.check([l for l in lines if l["job"] == "crash"], TRAIN, 6)
            rejoined = [l for l in lines if l["job"] == "crash" and l["world_size"] == 2
                        and l["generation"] > 1]
            self.assertTrue(rejoined, "the lost rank came back in a later generation of two")
        finally:
            cluster.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
