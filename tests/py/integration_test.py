#!/usr/bin/python3
"""A coordinator and workers as real processes on loopback, spoken to through
gRPC reflection alone, as an operator's grpcurl would."""
import os
import signal
import subprocess
import sys
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import BIN, free_port, wait_for  # noqa: E402


class ThreeWorkersTest(unittest.TestCase):
    def setUp(self):
        # Gloo over TCP, as across machines (tests/py/unused_parameters_test.py
        # runs "auto", which shares memory on one machine).
        self.cluster = Cluster(job=synthetic_job("three", 3, epochs=2, maxSteps=40))

    def tearDown(self):
        self.cluster.stop()

    def test_ranks_probe_and_operator_rpcs(self):
        c = self.cluster
        for i in (2, 0, 1):
            c.start_worker(i)
        running = c.wait_state("JOB_STATE_RUNNING", timeout=30)
        self.assertEqual(running["generation"], "1")
        self.assertEqual(running["world_size"], 3)

        done = c.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=120)
        self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done.get("message"))
        workers = done["workers"]
        self.assertEqual(len(workers), 3)
        # Ranks 0..2, each assigned exactly once, in (host, device) order.
        self.assertEqual(sorted(w["rank"] for w in workers), [0, 1, 2])
        for w in workers:
            self.assertEqual(w["rank"], int(w["device"].split(":")[1]))
            # The probe all-reduce proved the ring: 1 + 2 + 3 on every rank.
            self.assertEqual(w["probe"]["expected"], 6)
            self.assertEqual(w["probe"]["observed"], 6)
            self.assertEqual(w["probe"]["backend"], "gloo")
            self.assertEqual(w["step"], "40", w)
        # Replicas agree bit for bit at the end.
        self.assertEqual(len({w["parameter_digest"] for w in workers}), 1)
        self.assertEqual(done["global_step"], "40")

        listed = c.client.call("ddp.v1.Coordinator/ListWorkers")["workers"]
        self.assertEqual([w["worker_id"] for w in listed], ["w0", "w1", "w2"])

        health = c.client.call("grpc.health.v1.Health/Check", '{"service": "ddp.v1.Coordinator"}')
        self.assertEqual(health["status"], "SERVING")
        with self.assertRaises(grpc.RpcError) as e:
            c.client.call("grpc.health.v1.Health/Check", '{"service": "nope"}')
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

        watch, request, _ = c.client.stub("ddp.v1.Coordinator/WatchStatus")
        stream = watch(request(interval_seconds=0.1), timeout=10)
        snapshots = [next(stream), next(stream)]
        stream.cancel()
        self.assertTrue(all(s.job_id == "three" for s in snapshots))

        # Each worker wrote one metrics line per step.
        self.assertEqual([m["step"] for m in c.metrics("w1")], list(range(1, 41)))


class BadInputTest(unittest.TestCase):
    """Bad requests get clear errors; the running job never notices."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(job=synthetic_job("steady", 2, epochs=1000))
        cls.cluster.start_worker(0)
        cls.cluster.start_worker(1)
        cls.running = cls.cluster.wait_state("JOB_STATE_RUNNING", timeout=30)
        wait_for(lambda: int(cls.cluster.status().get("global_step", 0)) > 0, 30, "a first step")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def assertUntouched(self):
        s = self.cluster.status()
        self.assertEqual(s["state"], "JOB_STATE_RUNNING", s.get("message"))
        self.assertEqual(s["generation"], self.running["generation"])
        self.assertEqual(s["job_id"], "steady")
        return s

    def assertRpcError(self, code, fragment, method, request):
        with self.assertRaises(grpc.RpcError) as e:
            self.cluster.client.call(method, request)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        self.assertIn(fragment, e.exception.details())

    def attach(self, messages):
        """Opens an Attach stream, sends `messages`, returns (replies, error)."""
        attach, _, _ = self.cluster.client.stub("ddp.v1.Coordinator/Attach")
        client = self.cluster.client
        requests = [client.message("ddp.v1.WorkerMessage", m) for m in messages]
        replies = []

        def gen():
            for r in requests:
                yield r
            time.sleep(1.0)  # let the answers come before hanging up

        call = attach(gen(), timeout=5)
        try:
            for reply in call:
                replies.append(client.to_dict(reply))
        except grpc.RpcError as e:
            return replies, e
        return replies, None

    def register(self, host, device, name=None):
        r = {"host": host, "device": device, "version": self.version(), "pid": 1}
        if name:
            r["name"] = name
        return {"register": r}

    def version(self):
        return [w for w in self.cluster.status()["workers"]][0]["version"]

    def test_invalid_spec_names_the_field(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "job.batch_size",
                            "ddp.v1.Coordinator/SubmitJob", '{"spec": {"batchSize": 1000000}}')
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "job.optimizer.kind",
                            "ddp.v1.Coordinator/SubmitJob",
                            '{"spec": {"optimizer": {"kind": "lamb"}}}')
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "spec is missing",
                            "ddp.v1.Coordinator/SubmitJob", '{}')
        self.assertUntouched()

    def test_second_job_while_running_is_queued_and_can_be_cancelled(self):
        C = "ddp.v1.Coordinator/"
        client = self.cluster.client
        queued = client.call(C + "SubmitJob", '{"spec": {"name": "other", "priority": 3}}')
        self.assertEqual(queued["state"], "JOB_STATE_QUEUED", queued)
        self.assertIn('running: "steady"', queued["message"])
        # The status is a snapshot, republished within moments.
        wait_for(lambda: [j["job_id"] for j in self.cluster.status().get("queue", [])] == ["other"],
                 10, "the status to show the queue")
        listed = client.call(C + "ListJobs")["jobs"]
        self.assertEqual([(j["job_id"], j["state"]) for j in listed],
                         [("steady", "JOB_STATE_RUNNING"), ("other", "JOB_STATE_QUEUED")])
        self.assertEqual(client.call(C + "GetJob", '{"job_id": "other"}')["spec"]["priority"], 3)
        client.call(C + "CancelJob", '{"job_id": "other"}')
        # Kept as a job that ended before it started: cancelled once only.
        self.assertEqual(client.call(C + "GetJob", '{"job_id": "other"}')["state"],
                         "JOB_STATE_CANCELLED")
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, "already ended", C + "CancelJob",
                            '{"job_id": "other"}')
        self.assertUntouched()

    def test_unknown_device_is_refused(self):
        replies, error = self.attach([self.register("10.9.9.9", "gpu0")])
        self.assertIsNotNone(error)
        self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("gpu0", error.details())
        self.assertIn("cuda:N", error.details())
        self.assertUntouched()

    def test_second_worker_on_same_host_and_device_is_refused(self):
        replies, error = self.attach([self.register("127.0.0.1", "cpu:0", name="intruder")])
        self.assertIsNotNone(error)
        self.assertEqual(error.code(), grpc.StatusCode.ALREADY_EXISTS)
        self.assertIn("w0", error.details())
        self.assertUntouched()

    def test_stale_generation_report_is_rejected(self):
        stale = {"reports": {"reports": [{"generation": 999, "step": 5, "loss": 1.0}]}}
        replies, error = self.attach([self.register("10.9.9.8", "cpu:0", name="stale"), stale])
        kinds = [next(iter(r)) for r in replies]
        self.assertEqual(kinds[0], "registered")
        rejected = [r["rejected"] for r in replies if "rejected" in r]
        self.assertEqual(len(rejected), 1, replies)
        self.assertEqual(rejected[0]["code"], 9)  # FAILED_PRECONDITION
        self.assertIn("stale generation 999", rejected[0]["message"])
        self.assertUntouched()

    def test_store_fencing_and_deadline(self):
        gen = int(self.running["generation"])
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, "stale generation",
                            "ddp.v1.Coordinator/StoreSet",
                            '{"job_id": "steady", "generation": %d, "key": "k"}' % (gen - 1 if gen > 1 else 77))
        start = time.time()
        self.assertRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "never",
                            "ddp.v1.Coordinator/StoreGet",
                            '{"job_id": "steady", "generation": %d, "key": "never", '
                            '"timeout_seconds": 0.5}' % gen)
        self.assertLess(time.time() - start, 5)
        self.cluster.client.call("ddp.v1.Coordinator/StoreSet",
                                 '{"job_id": "steady", "generation": %d, "key": "k", "value": "dg=="}' % gen)
        got = self.cluster.client.call("ddp.v1.Coordinator/StoreGet",
                                       '{"job_id": "steady", "generation": %d, "key": "k"}' % gen)
        self.assertEqual(got["value"], "dg==")
        added = self.cluster.client.call("ddp.v1.Coordinator/StoreAdd",
                                         '{"job_id": "steady", "generation": %d, "key": "n", "delta": 3}' % gen)
        self.assertEqual(added["value"], "3")
        s = self.assertUntouched()
        # Training went on through all of it.
        wait_for(lambda: int(self.cluster.status()["global_step"]) > int(s["global_step"]), 30,
                 "more steps")


class WorkerBeforeCoordinatorTest(unittest.TestCase):
    def test_worker_waits_then_attaches(self):
        port = free_port()
        worker = subprocess.Popen(
            [os.path.join(BIN, "ddp-worker"), "--coordinator=127.0.0.1:%d" % port,
             "--device=cpu:0", "--host=127.0.0.1", "--name=early", "--threads=1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        coordinator = None
        try:
            time.sleep(1.5)  # the worker is retrying with backoff
            self.assertIsNone(worker.poll())
            coordinator = subprocess.Popen(
                [os.path.join(BIN, "ddp-coordinator"), "--listen=127.0.0.1:%d" % port],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            from grpc_reflect import ReflectionClient, local_token_file
            # Its own tokens, written before it serves.
            wait_for(lambda: local_token_file("127.0.0.1:%d" % port), 20, "the coordinator's tokens")
            client = ReflectionClient("127.0.0.1:%d" % port)
            wait_for(lambda: client.call("ddp.v1.Coordinator/ListWorkers").get("workers"), 20,
                     "the early worker to attach")
            client.close()
        finally:
            worker.send_signal(signal.SIGTERM)
            self.assertEqual(worker.wait(timeout=10), 0)
            if coordinator:
                coordinator.send_signal(signal.SIGTERM)
                self.assertEqual(coordinator.wait(timeout=10), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
