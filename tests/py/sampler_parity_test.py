#!/usr/bin/python3
"""Our sampler's indices equal torch.utils.data.distributed.DistributedSampler's,
element for element, for a table of dataset sizes (divisible by the world size
and not), seeds, epochs, ranks, world sizes, shuffle and drop_last; and from an
epoch cursor c, they equal DistributedSampler's split of the suffix P[c:] of
the epoch's permutation (the elastic rule in common/sampler.h)."""
import functools
import itertools
import os
import subprocess
import sys
import unittest

import torch
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
from harness import BIN  # noqa: E402


def run_tool(lines):
    """ddp_sampler_indices on the given input lines: a list of index lists."""
    out = subprocess.run([os.path.join(BIN, "ddp_sampler_indices")], input="".join(lines),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return [[int(i) for i in line.split()] for line in out]


@functools.lru_cache(maxsize=None)
def epoch_order(size, seed, epoch, shuffle):
    """P: the permutation DistributedSampler draws for (seed, epoch), or 0..N-1."""
    if not shuffle:
        return tuple(range(size))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return tuple(torch.randperm(size, generator=g).tolist())


def rule_indices(size, seed, epoch, rank, world, shuffle, drop_last, cursor):
    """The elastic rule, by DistributedSampler itself: split the suffix P[c:]
    as a dataset of its positions, unshuffled, and map positions to samples."""
    suffix = epoch_order(size, seed, epoch, shuffle)[cursor:]
    sampler = DistributedSampler(range(len(suffix)), num_replicas=world, rank=rank,
                                 shuffle=False, drop_last=drop_last)
    return [suffix[i] for i in sampler]


def cursors(size, world):
    """Cursors worth checking: the ends, just inside them, fewer samples left
    than ranks, and a few in the middle."""
    picks = {0, 1, size // 3, size // 2, size - 1, size, size - world + 1, size - 2 * world - 1}
    return sorted(c for c in picks if 0 <= c <= size)


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

    def test_cursor_matches_pytorch_on_suffix(self):
        cases = []
        for size, world, seed, epoch, shuffle, drop_last in itertools.product(
                [1, 2, 7, 10, 64, 1001, 60000], [1, 2, 3, 5, 8], [0, 2**31 + 5], [0, 3],
                [True, False], [True, False]):
            if not shuffle and (seed or epoch):
                continue  # shuffle off ignores both
            for cursor in cursors(size, world):
                for rank in range(world):
                    cases.append((size, seed, epoch, rank, world, shuffle, drop_last, cursor))
        out = run_tool("%d %d %d %d %d %d %d %d\n" % (s, seed, e, r, w, int(sh), int(dl), c)
                       for s, seed, e, r, w, sh, dl, c in cases)
        self.assertEqual(len(out), len(cases))
        for case, ours in zip(cases, out):
            self.assertEqual(ours, rule_indices(*case),
                             "size=%d seed=%d epoch=%d rank=%d world=%d shuffle=%s "
                             "drop_last=%s cursor=%d" % case)
        print("%d sampler configurations with a cursor match PyTorch" % len(cases))


if __name__ == "__main__":
    unittest.main(verbosity=2)
