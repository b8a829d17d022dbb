#!/usr/bin/python3
"""The job queue between real processes: jobs submitted while another holds
the pool are QUEUED saying behind whom, listed in the order they will run
(priority, then submission), a queued one can be cancelled, and when a job
ends the next takes the same worker processes, which never restart."""
import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import wait_for  # noqa: E402

C = "ddp.v1.Coordinator/"


class JobQueueTest(unittest.TestCase):
    def test_queued_jobs_run_in_turn_on_the_same_workers(self):
        cluster = Cluster(job=synthetic_job("first", 2, evaluate=False))
        try:
            # No worker yet: "first" holds the pool, waiting for two.
            cluster.wait_state("JOB_STATE_WAITING")
            client = cluster.client
            for name, priority in (("low", 0), ("high", 5), ("doomed", 1)):
                job = synthetic_job(name, 2, evaluate=False, priority=priority)
                answer = client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(job))
                self.assertEqual(answer["state"], "JOB_STATE_QUEUED", answer)
                # The head says whom it waits for; the rest, how many are ahead.
                self.assertRegex(answer["message"], r'running: "first"|queued ahead of it')
            listed = client.call(C + "ListJobs")
            self.assertEqual([j["job_id"] for j in listed["jobs"]],
                             ["first", "high", "doomed", "low"])
            self.assertEqual([j.get("queue_position", 0) for j in listed["jobs"]], [0, 1, 2, 3])
            # The status is a snapshot, republished within moments.
            wait_for(lambda: cluster.status().get("queued_jobs") == 3, 10, "the status's queue")
            client.call(C + "CancelJob", '{"job_id": "doomed", "reason": "not needed"}')
            page = client.call(C + "ListJobs", '{"state": "JOB_STATE_QUEUED", "page_size": 1}')
            self.assertEqual([j["job_id"] for j in page["jobs"]], ["high"])
            self.assertEqual(page["total_size"], 2)
            rest = client.call(C + "ListJobs", '{"state": "JOB_STATE_QUEUED", "page_token": "%s"}'
                               % page["next_page_token"])
            self.assertEqual([j["job_id"] for j in rest["jobs"]], ["low"])

            workers = [cluster.start_worker(i) for i in range(2)]
            wait_for(lambda: (lambda s: s["job_id"] == "low" and
                              s["state"] == "JOB_STATE_SUCCEEDED")(cluster.status()), 240,
                     "the queue to drain (last: %s)" % cluster._brief())
            log = cluster.log("coordinator")
            ended = re.findall(r"job (\w+) succeeded in generation (\d+)", log)
            self.assertEqual([name for name, _ in ended], ["first", "high", "low"], log)
            generations = [int(g) for _, g in ended]
            self.assertEqual(generations, sorted(set(generations)), log)  # fencing goes on
            self.assertNotIn("doomed", re.findall(r"job (\w+) leaves the queue", log))
            # The same two processes trained all three jobs.
            for w in workers:
                self.assertIsNone(w.poll(), "a worker exited between jobs")
            listed = client.call(C + "ListWorkers")["workers"]
            self.assertEqual(sorted(int(w["pid"]) for w in listed),
                             sorted(w.pid for w in workers))
            self.assertEqual(cluster.status().get("queued_jobs", 0), 0)
        finally:
            cluster.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
