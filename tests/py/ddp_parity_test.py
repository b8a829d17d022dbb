#!/usr/bin/python3
"""Two of our workers train the same model as PyTorch DDP (Debian's
python3-torch, gloo, ranks started by hand with env:// variables) from the same
initial weights (a saved TorchScript module), on the same real data in the
same order, with the same hyper-parameters: per-step losses agree on every
rank for over 100 steps, and so do the final weights. SGD with momentum and
weight decay, and Adam."""
import json
import os
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import load_dataset, run_ddp_run, run_reference  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class DdpParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-parity-")
        torch.manual_seed(1234)
        cls.model = os.path.join(cls.dir, "net.pt")
        torch.jit.script(Net()).save(cls.model)
        # Real data: the first 4096 Fashion-MNIST training images, and 1000 test ones.
        tx, ty, vx, vy = load_dataset({"kind": "fashion-mnist"}, 0)
        cls.train = os.path.join(cls.dir, "train.pt")
        cls.test = os.path.join(cls.dir, "test.pt")
        torch.save((tx[:4100].clone(), ty[:4100].clone()), cls.train)
        torch.save((vx[:1000].clone(), vy[:1000].clone()), cls.test)

    def job(self, name, optimizer, compression="none", **extra):
        # 4100 samples on 2 ranks, 32 a batch: 65 steps an epoch (the last
        # batch partial), 130 in two epochs.
        return {"name": name, "model": {"kind": "torchscript", "path": self.model},
                "dataset": {"kind": "tensors", "path": self.train, "testPath": self.test},
                "optimizer": optimizer, "batchSize": 32, "epochs": 2, "seed": 7,
                "backend": "gloo", "bucketCapMb": 0.1, "compression": compression,
                "outputPath": os.path.join(self.dir, name + "-ours.pt"), **extra}

    def check(self, name, optimizer, compression="none", job=None, steps=130, parameters=None,
              reference_args=(), **extra):
        """`job` replaces self.job's; `parameters` is the model's count;
        `reference_args` go to bench/pytorch_ddp.py; `extra`: more job fields."""
        job_file = os.path.join(self.dir, name + ".json")
        with open(job_file, "w") as f:
            json.dump(job or self.job(name, optimizer, compression, **extra), f)
        records = run_ddp_run(job_file, 2, tempfile.mkdtemp(prefix=name + "-ours-", dir=self.dir),
                              timeout=300)
        ours = [[r["loss"] for r in rank] for rank in records]
        # What crossed the wire: 16-bit gradients when compressed.
        gradient_bytes = 4 * (parameters or sum(p.numel() for p in Net().parameters()))
        sent = records[0][-1]["bytes"]
        if compression == "none":
            self.assertGreaterEqual(sent, gradient_bytes)
        else:
            self.assertLess(sent, 0.6 * gradient_bytes)
        ref = [[r["loss"] for r in rank] for rank in run_reference(
            job_file, 2, tempfile.mkdtemp(prefix=name + "-ref-", dir=self.dir),
            extra=["--output", os.path.join(self.dir, name + "-ref.pt")] + list(reference_args),
            timeout=300)]
        for rank in range(2):
            self.assertEqual(len(ours[rank]), steps)
            self.assertEqual(len(ref[rank]), steps)
            for step, (a, b) in enumerate(zip(ours[rank], ref[rank]), start=1):
                self.assertAlmostEqual(a, b, delta=1e-5 * max(1.0, abs(b)),
                                       msg="rank %d step %d" % (rank, step))
        # The ranks saw different data, so their losses differ.
        self.assertNotEqual(ours[0][:10], ours[1][:10])
        # Training did something.
        self.assertLess(sum(ours[0][-10:]), sum(ours[0][:10]))
        ours_file = os.path.join(self.dir, name + "-ours.pt")
        trained = (torch.load(ours_file) if job else torch.jit.load(ours_file).state_dict())
        reference = torch.load(os.path.join(self.dir, name + "-ref.pt"))
        self.assertEqual(sorted(trained), sorted(reference))
        for key in reference:
            self.assertTrue(torch.allclose(trained[key], reference[key], rtol=1e-4, atol=1e-5),
                            "%s differs by %g" % (key, (trained[key] - reference[key]).abs().max()))
        worst = max(abs(a - b) for r in range(2) for a, b in zip(ours[r], ref[r]))
        print("%s: 2 x %d steps, largest loss difference %.3g" % (name, steps, worst))

    def test_sgd_momentum_weight_decay(self):
        self.check("sgd", {"kind": "sgd", "lr": 0.05, "momentum": 0.9, "weightDecay": 1e-4})

    def test_adam(self):
        self.check("adam", {"kind": "adam", "lr": 0.001})

    # Gradient compression against PyTorch DDP with the matching comm hook
    # (bench/pytorch_ddp.py): the same casts, divisions and sums, so the
    # same tolerance holds as without.
    def test_fp16_compression_as_fp16_compress_hook(self):
        self.check("fp16", {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "fp16")

    def test_bf16_compression_as_bf16_compress_hook(self):
        self.check("bf16", {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "bf16")

    # PowerSGD against PyTorch's powerSGD_hook with the same state: 10 plain
    # steps, then low-rank factors with error feedback and warm start; the
    # same random Q (numpy's seeds, torch.randn), products and
    # orthogonalization, so the same tolerance holds. Rank 1 and 2
    # orthogonalize by Gram-Schmidt, larger ranks by QR.
    def test_powersgd_rank_1_as_powerSGD_hook(self):
        self.check("powersgd1", {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "powersgd",
                   powersgdRank=1, powersgdStartStep=10)

    def test_powersgd_rank_4_as_powerSGD_hook(self):
        self.check("powersgd4", {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "powersgd",
                   powersgdRank=4, powersgdStartStep=10)

    def resnet18_job(self, name, **extra):
        """ResNet-18 on 320 small (3x8x8) synthetic images: 2 ranks, 16 a
        batch, 10 steps an epoch, 2 epochs."""
        g = torch.Generator()
        g.manual_seed(3)
        prototypes = torch.randn(10, 3, 8, 8, generator=g)
        y = torch.randint(10, (384,), generator=g)
        x = prototypes[y] + torch.randn(384, 3, 8, 8, generator=g)
        train, test = (os.path.join(self.dir, "rgb-%s.pt" % part) for part in ("train", "test"))
        torch.save((x[:320].clone(), y[:320].clone()), train)
        torch.save((x[320:].clone(), y[320:].clone()), test)
        return dict({"name": name, "model": {"kind": "resnet18"},
                     "dataset": {"kind": "tensors", "path": train, "testPath": test},
                     "optimizer": {"kind": "sgd", "lr": 0.02, "momentum": 0.9}, "batchSize": 16,
                     "epochs": 2, "seed": 11, "backend": "gloo",
                     "outputPath": os.path.join(self.dir, name + "-ours.pt")}, **extra)

    def test_builtin_resnet18_as_the_reference_resnet18(self):
        """The built-in ResNet-18 (worker/model.cc) is bench/pytorch_ddp.py's:
        the same layers, names and initial weights from the same seed, batch
        norm buffers included, in several buckets (11.2 M parameters)."""
        self.check("resnet18", None, job=self.resnet18_job("resnet18"), steps=20,
                   parameters=11173962)

    def test_powersgd_on_resnet18_as_powerSGD_hook(self):
        """PowerSGD where the MLP can't reach: several buckets (a seed each),
        4-D convolution weights as matrices, same-shaped weights apart in a
        bucket grouped together, batch norm's vectors sent whole."""
        job = self.resnet18_job("resnet18-powersgd", compression="powersgd", powersgdRank=2,
                                powersgdStartStep=5)
        # PyTorch's hook over Gloo aborts here unless it waits bucket by
        # bucket (bench/pytorch_ddp.py's one_bucket_at_a_time).
        self.check("resnet18-powersgd", None, "powersgd", job=job, steps=20,
                   parameters=11173962, reference_args=["--serialize-hook"])

if __name__ == "__main__":
    unittest.main(verbosity=2)
