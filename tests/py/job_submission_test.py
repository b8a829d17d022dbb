#!/usr/bin/python3
"""Submitting jobs over gRPC: a TorchScript file that is missing, corrupt, or
whose forward does not fit the dataset fails the submission with a clear
INVALID_ARGUMENT, the coordinator keeps serving, and a good TorchScript job
submitted next trains to the end."""
import os
import sys
import tempfile
import unittest

import grpc
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402


class WantsColor(nn.Module):
    """Expects 3x32x32 images; the dataset has 1x28x28."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 10)

    def forward(self, x):
        return self.fc(x.reshape(x.shape[0], 3 * 32 * 32))


class FiveClasses(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 5)

    def forward(self, x):
        return self.fc(x.flatten(1))


class Good(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class JobSubmissionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-submit-")
        cls.files = {}
        for name, module in [("color", WantsColor()), ("five", FiveClasses()), ("good", Good())]:
            cls.files[name] = os.path.join(cls.dir, name + ".pt")
            torch.jit.script(module).save(cls.files[name])
        cls.files["corrupt"] = os.path.join(cls.dir, "corrupt.pt")
        with open(cls.files["corrupt"], "wb") as f:
            f.write(b"PK\x03\x04 this is no TorchScript archive")
        cls.cluster = Cluster()
        cls.cluster.start_worker(0)
        cls.cluster.start_worker(1)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def submit(self, path, **overrides):
        spec = synthetic_job("ts", 2, model={"kind": "torchscript", "path": path}, **overrides)
        request = self.cluster.client.message("ddp.v1.SubmitJobRequest", {"spec": spec})
        call, _, _ = self.cluster.client.stub("ddp.v1.Coordinator/SubmitJob")
        return call(request, timeout=30)

    def assertRefused(self, path, *fragments):
        with self.assertRaises(grpc.RpcError) as e:
            self.submit(path)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
        for fragment in fragments:
            self.assertIn(fragment, e.exception.details())
        # Still serving, no job taken.
        health = self.cluster.client.call("grpc.health.v1.Health/Check")
        self.assertEqual(health["status"], "SERVING")
        self.assertEqual(self.cluster.status()["state"], "JOB_STATE_UNSPECIFIED")

    def test_1_missing_file(self):
        self.assertRefused(os.path.join(self.dir, "nope.pt"), "model.path", "nope.pt")

    def test_2_corrupt_file(self):
        self.assertRefused(self.files["corrupt"], "model.path", "not a TorchScript module")

    def test_3_forward_does_not_fit_the_data(self):
        # At the job's batch size (32), as the workers will run it.
        self.assertRefused(self.files["color"], "model.path", "forward fails", "[32, 1, 28, 28]")

    def test_4_too_few_classes(self):
        # Says what is wrong without echoing the shape the model returned.
        self.assertRefused(self.files["five"], "model.path", "fewer logits per sample", "C >= 10")

    def test_5_good_torchscript_job_trains(self):
        self.submit(self.files["good"], epochs=2)
        done = self.cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=120)
        self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done["message"])
        self.assertEqual(len(done["epoch_results"]), 2)
        self.assertGreater(done["test_accuracy"], 0.5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
