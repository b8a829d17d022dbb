#!/usr/bin/python3
"""Two jobs side by side on one pool of real worker processes: each trains
on workers of its own (no process in both), a kill -9 of a worker of one job
re-forms only that job, and both succeed with every sample once (the
workers' index logs)."""
import json
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "chaos"))
import coverage  # noqa: E402
from cluster import Cluster, synthetic_job  # noqa: E402

C = "ddp.v1.Coordinator/"
TRAIN = 60000  # Fashion-MNIST
EPOCHS = 2


def job(name, min_workers, max_workers):
    """An MLP on Fashion-MNIST: ~10 s an epoch for two jobs of two workers
    on two cores, long enough to kill a worker mid-run."""
    return synthetic_job(name, min_workers, maxWorkers=max_workers, evaluate=False,
                         epochs=EPOCHS, seed=11, batchSize=64, dataset={"kind": "fashion-mnist"},
                         rejoinTimeoutSeconds=2, hangTimeoutSeconds=10)


class JobPoolTest(unittest.TestCase):
    def test_two_jobs_side_by_side_and_a_kill_reforms_only_its_job(self):
        cluster = Cluster()
        try:
            workers = [cluster.start_worker(
                i, extra=["--index_log=" + os.path.join(cluster.dir, "w%d.idx.jsonl" % i)])
                for i in range(4)]
            client = cluster.client
            cluster.wait_for(lambda: len(client.call(C + "ListWorkers").get("workers", [])) == 4,
                             60, "four workers to attach")
            for spec in (job("a", 1, 2), job("b", 2, 2)):
                answer = client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(spec))
                self.assertEqual(answer["state"], "JOB_STATE_WAITING", answer)

            def jobs():
                return {j["job_id"]: j for j in cluster.status().get("jobs", [])}

            def both_training():
                js = jobs()
                return all(js.get(n, {}).get("world_size") == 2 and
                           int(js[n].get("global_step", 0)) > 10 for n in ("a", "b")) and js
            running = cluster.wait_for(both_training, 120, "both jobs to train on two workers")
            by_job = {}
            for w in client.call(C + "ListWorkers")["workers"]:
                by_job.setdefault(w.get("job_id", ""), []).append(int(w["pid"]))
            self.assertEqual(sorted(len(by_job.get(n, [])) for n in ("a", "b")), [2, 2], by_job)
            self.assertFalse(set(by_job["a"]) & set(by_job["b"]), by_job)
            b_generation = running["b"]["generation"]

            # A worker of job a dies: a re-forms on its survivor; b trains on.
            os.kill(by_job["a"][0], signal.SIGKILL)
            cluster.wait_for(lambda: (lambda js: js["a"]["generation"] != running["a"]["generation"]
                                      and js["a"].get("world_size") == 1)(jobs()),
                             60, "job a to re-form without its killed worker")
            cluster.wait_for(lambda: all(j["state"] == "JOB_STATE_SUCCEEDED"
                                         for j in jobs().values()) and len(jobs()) == 2,
                             300, "both jobs to succeed")
            self.assertEqual(jobs()["b"]["generation"], b_generation, "b re-formed")

            lines = coverage.read_lines(os.path.join(cluster.dir, "*.idx.jsonl"))
            for name in ("a", "b"):
                mine = [l for l in lines if l["job"] == name]
                self.assertTrue(mine, name)
                coverage.check(mine, TRAIN, EPOCHS)
            self.assertEqual({l["generation"] for l in lines if l["job"] == "b"},
                             {int(b_generation)})
            self.assertEqual(len({l["generation"] for l in lines if l["job"] == "a"}), 2)
            for w in workers:
                if w.pid != by_job["a"][0]:
                    self.assertIsNone(w.poll(), "a worker exited")
        finally:
            cluster.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
