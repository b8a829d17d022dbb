#!/usr/bin/python3
"""The public library's ddp::DiskDataset, from a program's side: a program
on ddp::ddp reads an image folder through DiskDataset, DistributedSampler
and torch::data's DataLoader, two epochs on each of two ranks. Every batch
equals, tensor for tensor, what torchvision's ImageFolder with the same
transforms and PyTorch's DistributedSampler (set_epoch each epoch) give.
The same samples packed by ddp-pack read the same; augmentation draws from
(seed, epoch, index), so it is the same with one and with three loader
threads, and differs from epoch to epoch without set_epoch."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch
import torchvision
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
from harness import BIN  # noqa: E402
from image_folder_job_test import idx, write_folder  # noqa: E402

N, SEED, BATCH = 200, 7, 16
MEAN, STD = [0.2, 0.3, 0.4], [0.3, 0.35, 0.4]


def batches(spec, rank, out, epochs=2):
    done = subprocess.run([os.path.join(BIN, "ddp_library_disk_batches"), json.dumps(spec),
                           str(rank), "2", str(SEED), str(epochs), str(BATCH), out],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(done.stderr)
    flat = torch.load(out)
    return list(zip(flat[0::2], flat[1::2]))


class LibraryDiskDatasetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-libdisk-")
        cls.root = os.path.join(cls.dir, "train")
        write_folder(cls.root, idx("train-images-idx3-ubyte.gz", N, (28, 28)),
                     idx("train-labels-idx1-ubyte.gz", N, ()))
        cls.shards = os.path.join(cls.dir, "shards")
        subprocess.run([os.path.join(BIN, "ddp-pack"), "images", cls.root, cls.shards],
                       check=True, capture_output=True, timeout=60)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def out(self, name):
        return os.path.join(self.dir, name + ".pt")

    def test_batches_equal_torchvision_with_distributed_sampler(self):
        spec = {"kind": "image-folder", "path": self.root,
                "transforms": [{"kind": "Resize", "size": [32]},
                               {"kind": "CenterCrop", "size": [24, 20]}],
                "normalize": {"mean": MEAN, "std": STD}}
        t = torchvision.transforms
        folder = torchvision.datasets.ImageFolder(self.root, t.Compose([
            t.Resize(32), t.CenterCrop((24, 20)), t.ToTensor(), t.Normalize(MEAN, STD)]))
        for rank in (0, 1):
            got = batches(spec, rank, self.out("folder%d" % rank))
            sampler = DistributedSampler(folder, num_replicas=2, rank=rank, seed=SEED)
            want = []
            for epoch in range(2):
                sampler.set_epoch(epoch)
                want.extend(DataLoader(folder, batch_size=BATCH, sampler=sampler))
            self.assertEqual(len(got), len(want))
            for (gx, gy), (wx, wy) in zip(got, want):
                self.assertTrue(torch.equal(gy, wy))
                self.assertTrue(torch.equal(gx, wx), (gx - wx).abs().max())
            shards = batches(dict(spec, kind="shards", path=self.shards), rank,
                             self.out("shards%d" % rank))
            for (gx, gy), (sx, sy) in zip(got, shards):
                self.assertTrue(torch.equal(gx, sx) and torch.equal(gy, sy))

    def test_augmentation_follows_the_epoch_whatever_the_threads(self):
        spec = {"kind": "image-folder", "path": self.root,
                "transforms": [{"kind": "RandomResizedCrop", "size": [20]},
                               {"kind": "RandomHorizontalFlip"}]}
        one = batches(dict(spec, loaderThreads=1), 0, self.out("one"))
        three = batches(dict(spec, loaderThreads=3), 0, self.out("three"))
        for (ax, ay), (bx, by) in zip(one, three):
            self.assertTrue(torch.equal(ax, bx) and torch.equal(ay, by))
        # Epoch 2 is another shuffle and other crops of the same samples.
        per_epoch = len(one) // 2
        self.assertFalse(torch.equal(one[0][0], one[per_epoch][0]))
        with self.assertRaises(AssertionError) as e:
            batches({"kind": "image-folder", "path": os.path.join(self.dir, "none")}, 0,
                    self.out("none"))
        self.assertIn("none", str(e.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
