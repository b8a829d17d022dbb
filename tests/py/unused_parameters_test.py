#!/usr/bin/python3
"""A model with a branch that some ranks skip on some steps, and a layer no
rank ever uses, trains to the end on 2 and 3 workers: no "Expected to have
finished reduction in the prior iteration", no hang, and GetStatus names the
unused parameters. (PyTorch DDP needs find_unused_parameters=True for this
model, and then walks the autograd graph every step.)"""
import json
import os
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(784, 32)
        self.head = nn.Linear(32, 10)
        self.extra = nn.Linear(32, 10)
        self.never = nn.Linear(32, 10)

    def forward(self, x):
        h = F.relu(self.trunk(x.flatten(1)))
        out = self.head(h)
        # Data-dependent: a batch takes the extra branch or not, so on a given
        # step some ranks use `extra` and others don't (and sometimes none).
        if bool(x.mean() > 0.0):
            out = out + self.extra(h)
        return out


class UnusedParametersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-unused-")
        torch.manual_seed(0)
        cls.model = os.path.join(cls.dir, "branchy.pt")
        torch.jit.script(Branchy()).save(cls.model)

    def train(self, workers):
        job = synthetic_job("branchy-%d" % workers, workers, epochs=2, backend="auto",
                            model={"kind": "torchscript", "path": self.model},
                            dataset={"kind": "synthetic", "trainSize": 1536, "testSize": 256})
        cluster = Cluster(job=job)
        try:
            for i in range(workers):
                cluster.start_worker(i)
            done = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=180)
            self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done["message"])
            per_rank = -(-1536 // workers)
            steps = 2 * -(-per_rank // 32)
            self.assertEqual(int(done["global_step"]), steps)
            for w in done["workers"]:
                # "auto" on one machine: the shared-memory communicator.
                self.assertEqual(w["probe"]["backend"], "shm")
                self.assertIn("never.weight", w["unused_parameters"], w)
                self.assertIn("never.bias", w["unused_parameters"], w)
                self.assertNotIn("head.weight", w["unused_parameters"], w)
            # `extra` was skipped somewhere, and used somewhere.
            self.assertTrue(any("extra.weight" in w["unused_parameters"] for w in done["workers"]))
            metrics = [cluster.metrics("w%d" % i) for i in range(workers)]
            unused_counts = {m["unused_parameters"] for rank in metrics for m in rank}
            self.assertEqual(unused_counts, {2, 4})  # never.*, and sometimes extra.* too
            self.assertEqual(len({w["parameter_digest"] for w in done["workers"]}), 1)
            self.assertGreater(done["epoch_results"][-1]["test_accuracy"], 0.3)
        finally:
            cluster.stop()

    def test_two_workers(self):
        self.train(2)

    def test_three_workers(self):
        self.train(3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
