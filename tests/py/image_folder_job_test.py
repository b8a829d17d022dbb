#!/usr/bin/python3
"""A job on an image folder, read from disk as the sampler asks for it, on
two real workers: Fashion-MNIST written out as PNGs (ROOT/CLASS/IMAGE.png,
and a test folder). The same job on the same pixels as an in-memory
"tensors" file trains the same: every step's loss equal on every rank, the
same test accuracy. Every sample is trained once per epoch (the index
logs); the loader's images are the sampler's indices, in its order.

And the augmentation is a function of (seed, epoch, index): the same job
with a RandomResizedCrop and a flip, run with one loader thread and with
three, gives every step the same loss. A worker killed (-9) mid-run: the
job re-forms without it and still trains every sample once per epoch."""
import gzip
import json
import os
import shutil
import signal
import sys
import tempfile
import unittest

import numpy as np
from PIL import Image
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "chaos"))
import coverage  # noqa: E402
from cluster import Cluster, step_losses, synthetic_job  # noqa: E402

C = "ddp.v1.Coordinator/"
DATA = "/usr/share/datasets/fashion-mnist/"
TRAIN, TEST = 1024, 256
EPOCHS_KILLED = 60  # 10 s or more: a worker is killed mid-run


def idx(name, count, shape):
    with gzip.open(DATA + name) as f:
        f.read(8 if len(shape) == 0 else 16)
        n = count * int(np.prod(shape)) if shape else count
        return np.frombuffer(f.read(n), np.uint8).reshape((count,) + shape)


def write_folder(root, images, labels):
    """ROOT/CLASS/NNNN.png in the order torchvision's ImageFolder reads them
    back: by class, then by name. Returns the (pixels, label) of each index."""
    order = []
    for c in range(10):
        os.makedirs(os.path.join(root, "c%d" % c))
    for i, (x, y) in enumerate(zip(images, labels)):
        Image.fromarray(x, "L").save(os.path.join(root, "c%d" % y, "%05d.png" % i))
    for c in range(10):
        for i, (x, y) in enumerate(zip(images, labels)):
            if y == c:
                order.append((x, int(y)))
    return order


def as_tensors(order, path):
    """The same pixels, as ToTensor gives them for an RGB image (grey in all
    three channels), saved for a "tensors" job."""
    x = torch.tensor(np.stack([o[0] for o in order]), dtype=torch.float32) / 255.0
    x = x.unsqueeze(1).repeat(1, 3, 1, 1).contiguous()
    y = torch.tensor([o[1] for o in order], dtype=torch.int64)
    torch.save((x, y), path)


def job(name, dataset, **overrides):
    spec = synthetic_job(name, 2, dataset=dataset, epochs=2, seed=5, batchSize=32,
                         evaluate=True, model={"kind": "mlp"})
    spec.update(overrides)
    return spec


class ImageFolderJobTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-imagejob-")
        train_x = idx("train-images-idx3-ubyte.gz", TRAIN, (28, 28))
        train_y = idx("train-labels-idx1-ubyte.gz", TRAIN, ())
        test_x = idx("t10k-images-idx3-ubyte.gz", TEST, (28, 28))
        test_y = idx("t10k-labels-idx1-ubyte.gz", TEST, ())
        cls.train = os.path.join(cls.dir, "train")
        cls.test = os.path.join(cls.dir, "test")
        as_tensors(write_folder(cls.train, train_x, train_y), os.path.join(cls.dir, "train.pt"))
        as_tensors(write_folder(cls.test, test_x, test_y), os.path.join(cls.dir, "test.pt"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def start(self, workers, extra=()):
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        procs = []
        for i in range(workers):
            procs.append(cluster.start_worker(i, extra=[
                "--index_log=" + os.path.join(cluster.dir, "w%d.idx.jsonl" % i),
                "--metrics_file=" + os.path.join(cluster.dir, "w%d.steps.jsonl" % i)] +
                list(extra)))
        return cluster, procs

    def test_a_killed_worker_loses_no_sample(self):
        cluster, procs = self.start(3)
        spec = job("killed", {"kind": "image-folder", "path": self.train,
                              "transforms": [{"kind": "RandomResizedCrop", "size": [24]}]},
                   epochs=EPOCHS_KILLED, evaluate=False, minWorkers=1, maxWorkers=3,
                   rejoinTimeoutSeconds=1, batchSize=16)
        cluster.client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(spec))
        cluster.wait_for(lambda: int(cluster.status().get("global_step", 0)) > 40, 120,
                         "the job to train")
        # A member of the generation training now (w0, w1 or w2).
        victim = cluster.status()["members"][-1]
        os.kill(procs[int(victim[1:])].pid, signal.SIGKILL)
        cluster.wait_for(lambda: cluster.client.call(
            C + "GetStatus", '{"job_id": "killed"}')["state"] in
            ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), 300, "the job to end")
        final = cluster.client.call(C + "GetStatus", '{"job_id": "killed"}')
        self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final.get("message"))
        # Lost (its stream closed) or failed (a peer's collective broke
        # first): which is seen first depends on timing; a fault re-formed it.
        causes = {c["cause"] for c in final.get("generation_changes", [])}
        self.assertTrue(causes & {"CHANGE_CAUSE_LOST", "CHANGE_CAUSE_FAILED"}, causes)
        lines = coverage.read_lines(os.path.join(cluster.dir, "*.idx.jsonl"))
        coverage.check(lines, TRAIN, EPOCHS_KILLED)

    def run_jobs(self, specs, extra=()):
        """Each spec in turn on the same two workers; returns the cluster
        (stopped) and each job's final status."""
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        for i in range(2):
            cluster.start_worker(i, extra=[
                "--index_log=" + os.path.join(cluster.dir, "w%d.idx.jsonl" % i),
                "--metrics_file=" + os.path.join(cluster.dir, "w%d.steps.jsonl" % i)] +
                list(extra))
        finals = {}
        for spec in specs:
            cluster.client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(spec))
            # (GetStatus's view may be a tick behind GetJob's.)
            cluster.wait_for(lambda: cluster.client.call(
                C + "GetStatus", '{"job_id": "%s"}' % spec["name"])["state"] in
                ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), 300, spec["name"] + " to end")
            finals[spec["name"]] = cluster.client.call(
                C + "GetStatus", '{"job_id": "%s"}' % spec["name"])
            self.assertEqual(finals[spec["name"]]["state"], "JOB_STATE_SUCCEEDED",
                             finals[spec["name"]].get("message"))
        return cluster, finals

    def losses(self, cluster, name):
        lines = coverage.read_lines(os.path.join(cluster.dir, "*.idx.jsonl"))
        return step_losses(cluster.dir, lines, name)

    def test_trains_as_the_same_pixels_in_memory_and_every_sample_once(self):
        # The built-in CNN, on the folder's RGB 28x28 images.
        folder = job("folder", {"kind": "image-folder", "path": self.train,
                                "testPath": self.test, "loaderThreads": 2},
                     model={"kind": "cnn"})
        tensors = job("tensors", {"kind": "tensors", "path": os.path.join(self.dir, "train.pt"),
                                  "testPath": os.path.join(self.dir, "test.pt")},
                      model={"kind": "cnn"})
        cluster, finals = self.run_jobs([folder, tensors])
        lines = coverage.read_lines(os.path.join(cluster.dir, "*.idx.jsonl"))
        coverage.check([l for l in lines if l["job"] == "folder"], TRAIN, 2)
        got, want = self.losses(cluster, "folder"), self.losses(cluster, "tensors")
        self.assertEqual(len(got), 2 * 2 * (TRAIN // 64))
        self.assertEqual(got, want)
        self.assertEqual(finals["folder"]["test_accuracy"], finals["tensors"]["test_accuracy"])

    def test_augmentation_is_the_same_whatever_the_loader_threads(self):
        augment = [{"kind": "RandomResizedCrop", "size": [24], "scale": [0.5, 1.0]},
                   {"kind": "RandomHorizontalFlip"}]
        base = {"kind": "image-folder", "path": self.train, "transforms": augment,
                "normalize": {"mean": [0.3, 0.3, 0.3], "std": [0.35, 0.35, 0.35]}}
        one = job("one-thread", dict(base, loaderThreads=1), evaluate=False)
        three = job("three-threads", dict(base, loaderThreads=3, prefetchBatches=1),
                    evaluate=False)
        plain = job("plain", {"kind": "image-folder", "path": self.train}, evaluate=False)
        cluster, _ = self.run_jobs([one, three, plain])
        got, want = self.losses(cluster, "three-threads"), self.losses(cluster, "one-thread")
        self.assertTrue(got)
        self.assertEqual(got, want)
        # (And the augmentation did something.)
        self.assertNotEqual(got, self.losses(cluster, "plain"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
