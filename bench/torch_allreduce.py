#!/usr/bin/python3
"""Times torch.distributed.all_reduce (gloo) on float32 tensors, one process
per rank started with env:// variables; rank 0 prints one JSON line per size,
in the same format as ddp_allreduce_bench."""
import argparse
import json
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4096,65536,1048576,4194304,16777216,67108864")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in map(int, args.sizes.split(",")):
        t = torch.ones(nbytes // 4)
        start = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(t)
        per = (time.perf_counter() - start) / 3
        iters = torch.tensor([float(max(5, int(args.seconds / max(per, 1e-6))) if rank == 0 else 0)])
        dist.all_reduce(iters)
        times = []
        for _ in range(int(iters.item())):
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append((time.perf_counter() - start) * 1e6)
        times.sort()
        if rank == 0:
            pick = lambda p: times[int(p * (len(times) - 1))]
            print(json.dumps({"impl": "pytorch", "world": world, "bytes": nbytes,
                              "iters": len(times), "p50_us": round(pick(0.5), 1),
                              "p10_us": round(pick(0.1), 1), "p90_us": round(pick(0.9), 1)}),
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
