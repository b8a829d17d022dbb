#!/usr/bin/python3
"""Our sampler's indices equal torch.utils.data.distributed.DistributedSampler's,
element for element, for a table of dataset sizes (divisible by the world size
and not), seeds, epochs, ranks, world sizes, shuffle and drop_last."""
import itertools
import os
import subprocess
import sys
import unittest

from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
from cluster import BIN  # noqa: E402


class SamplerParityTest(unittest.TestCase):
    def test_matches_pytorch(self):
        cases = []
        for size, world, seed, epoch, shuffle, drop_last in itertools.product(
                [1, 2, 7, 10, 64, 1000, 1001, 60000], [1, 2, 3, 4, 8], [0, 42, 2**31 + 5],
                [0, 1, 7], [True, False], [True, False]):
            if not shuffle and (seed or epoch):
                continue  # shuffle off ignores both
            for rank in range(world):
                cases.append((size, seed, epoch, rank, world, shuffle, drop_last))
        stdin = "".join("%d %d %d %d %d %d %d\n" % (s, seed, e, r, w, int(sh), int(dl))
                        for s, seed, e, r, w, sh, dl in cases)
        out = subprocess.run([os.path.join(BIN, "ddp_sampler_indices")], input=stdin,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        self.assertEqual(len(out), len(cases))
        for case, line in zip(cases, out):
            size, seed, epoch, rank, world, shuffle, drop_last = case
            sampler = DistributedSampler(range(size), num_replicas=world, rank=rank,
                                         shuffle=shuffle, seed=seed, drop_last=drop_last)
            sampler.set_epoch(epoch)
            ours = [int(i) for i in line.split()]
            self.assertEqual(ours, list(sampler), "size=%d seed=%d epoch=%d rank=%d world=%d "
                             "shuffle=%s drop_last=%s" % case)
        print("%d sampler configurations match PyTorch" % len(cases))


if __name__ == "__main__":
    unittest.main(verbosity=2)
