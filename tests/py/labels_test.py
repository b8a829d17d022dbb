#!/usr/bin/python3
"""Worker labels and a job's workerSelector, between real processes: of three
workers only the one labelled zone=a trains a job that selects zone=a (the
others stay idle and are never asked), every worker's labels are in
ListWorkers, and a worker started with malformed --labels exits at once
saying what is wrong."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import BIN, wait_for  # noqa: E402


class LabelsTest(unittest.TestCase):
    def test_only_the_selected_worker_trains(self):
        job = synthetic_job("zone-a", 1, maxWorkers=2, workerSelector={"zone": "a"}, maxSteps=20,
                            evaluate=False)
        cluster = Cluster(job=job)
        try:
            cluster.start_worker(0, extra=["--labels=zone=b,gpu=none"])
            cluster.start_worker(1)
            cluster.wait_state("JOB_STATE_WAITING")
            # Two workers attached, neither labelled zone=a: the job says so.
            wait_for(lambda: len(cluster.client.call("ddp.v1.Coordinator/ListWorkers")
                                 .get("workers", [])) == 2, 60, "two workers attached")
            waiting = cluster.status()
            self.assertEqual(waiting["state"], "JOB_STATE_WAITING", waiting)
            self.assertIn("only workers labelled zone=a count", waiting["message"])
            cluster.start_worker(2, extra=["--labels=zone=a"])
            final = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"])
            self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final)
            workers = {w["worker_id"]: w for w in
                       cluster.client.call("ddp.v1.Coordinator/ListWorkers")["workers"]}
            self.assertEqual(workers["w0"]["labels"], {"zone": "b", "gpu": "none"})
            self.assertEqual(workers["w1"]["labels"], {})
            self.assertEqual(workers["w2"]["labels"], {"zone": "a"})
            # Only w2 trained: the others never held a generation.
            self.assertEqual(workers["w2"]["step"], "20")
            for idle in ("w0", "w1"):
                self.assertEqual(workers[idle]["generation"], "0", workers[idle])
                self.assertEqual(workers[idle]["step"], "0", workers[idle])
            with open(os.path.join(cluster.dir, "coordinator.log")) as f:
                self.assertIn("labels zone=a)", f.read())
        finally:
            cluster.stop()

    def test_malformed_labels_exit_at_once_naming_the_flag(self):
        run = subprocess.run([os.path.join(BIN, "ddp-worker"), "--labels=zone",
                              "--coordinator=127.0.0.1:1"], capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
        self.assertIn('--labels: "zone" is not key=value', run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
