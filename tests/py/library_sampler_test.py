#!/usr/bin/python3
"""ddp::DistributedSampler through torch::data's DataLoader against Python's
DistributedSampler through torch.utils.data.DataLoader, batch for batch, on
a grid of dataset sizes, world sizes, ranks, seeds, shuffle, drop_last and
batch sizes; over three epochs in a row, where ours moves the epoch on by
itself and the Python loop calls set_epoch."""
import itertools
import os
import subprocess
import sys
import unittest

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
from harness import BIN  # noqa: E402

TOOL = os.path.join(BIN, "ddp_library_sampler_batches")


def python_batches(n, world, rank, seed, epoch, shuffle, drop_last, batch):
    dataset = list(range(n))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    out = []
    for e in range(epoch, epoch + 3):
        sampler.set_epoch(e)
        out.append("epoch %d" % e)
        out.extend(str(b.tolist()) for b in loader)
    return out


@unittest.skipUnless(os.path.exists(TOOL), TOOL + " is not built")
class LibrarySamplerTest(unittest.TestCase):
    def test_batches_equal_pytorch_on_a_grid(self):
        cases = []
        for n, world, seed, shuffle, drop_last, batch in itertools.product(
                (1, 7, 10, 64, 1000), (1, 2, 3, 8), (0, 42), (True, False), (False, True),
                (1, 5, 32)):
            for rank in sorted({0, world - 1}):
                cases.append((n, world, rank, seed, seed % 5, int(shuffle), int(drop_last),
                              batch))
        stdin = "".join(" ".join(map(str, c)) + "\n" for c in cases)
        out = subprocess.run([TOOL], input=stdin, capture_output=True, text=True, timeout=120,
                             check=True).stdout
        blocks = out.split("end\n")
        self.assertEqual(len(blocks), len(cases) + 1)
        for case, block in zip(cases, blocks):
            n, world, rank, seed, epoch, shuffle, drop_last, batch = case
            expected = python_batches(n, world, rank, seed, epoch, bool(shuffle),
                                      bool(drop_last), batch)
            self.assertEqual(block.splitlines(), expected, "case %s" % (case,))
        print("library_sampler_test: %d cases equal" % len(cases))

if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
