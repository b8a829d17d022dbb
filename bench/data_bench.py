#!/usr/bin/python3
"""The image-folder loader against torchvision's, on the same files and
cores: writes docs/DATA.md.

Makes two image folders of JPEGs from Fashion-MNIST (RGB, upscaled to
64x64 and to 224x224, quality 90), then reads every image once with a
training pipeline (RandomResizedCrop to 56 or 224, RandomHorizontalFlip,
ToTensor, Normalize), batches of 64:
  - build/bin/ddp_image_loader_bench: the worker's ReadImageBatch on 1 and 2
    threads;
  - torchvision's ImageFolder + DataLoader(num_workers=1 and 2), each worker
    process at one intra-op thread.
Images/s are best of three runs each, measured in the same run. Threads
first: OMP, OpenBLAS and LibTorch each at one thread per worker.

    /usr/bin/python3 bench/data_bench.py        # a few minutes

Not yet measured here (issue 25): training samples/s against PyTorch DDP
with the same loader, and peak RSS against dataset size under a memory
cgroup.
"""
import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = "/usr/share/datasets/fashion-mnist/"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_folder(root, count, side):
    with gzip.open(DATA + "train-images-idx3-ubyte.gz") as f:
        f.read(16)
        x = np.frombuffer(f.read(count * 784), np.uint8).reshape(count, 28, 28)
    with gzip.open(DATA + "train-labels-idx1-ubyte.gz") as f:
        f.read(8)
        y = np.frombuffer(f.read(count), np.uint8)
    for c in range(10):
        os.makedirs(os.path.join(root, "c%d" % c), exist_ok=True)
    for i in range(count):
        g = Image.fromarray(x[i], "L")
        rgb = Image.merge("RGB", (g, g.point(lambda v: 255 - v), g.point(lambda v: v // 2)))
        rgb.resize((side, side), Image.BILINEAR).save(
            os.path.join(root, "c%d" % y[i], "%05d.jpg" % i), quality=90)


def ours(binary, root, threads, size):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([binary, root, str(threads), str(size)], capture_output=True, text=True,
                         env=env, timeout=600, check=True)
    return json.loads(out.stdout)["images_per_sec"]


TORCHVISION = r"""
import sys, time, torch
from torchvision import datasets, transforms
torch.set_num_threads(1)
root, workers, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                        transforms.ToTensor(),
                        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
data = datasets.ImageFolder(root, t)
loader = torch.utils.data.DataLoader(data, batch_size=64, num_workers=workers,
                                     worker_init_fn=lambda _: torch.set_num_threads(1))
start = time.time()
n = 0
for x, y in loader:
    n += x.shape[0]
print(n / (time.time() - start))
"""


def theirs(root, workers, size):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", TORCHVISION, root, str(workers), str(size)],
                         capture_output=True, text=True, env=env, timeout=600, check=True)
    return float(out.stdout.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "ddp_image_loader_bench"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "DATA.md"))
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ddp-databench-")
    rows = []
    try:
        for side, crop in ((64, 56), (224, 224)):
            root = os.path.join(work, "side%d" % side)
            make_folder(root, args.images, side)
            for threads in (1, 2):
                a = max(ours(args.bin, root, threads, crop) for _ in range(args.repeats))
                b = max(theirs(root, threads, crop) for _ in range(args.repeats))
                rows.append((side, crop, threads, a, b))
                print("%dx%d JPEG -> %d, %d thread(s)/worker(s): ours %.0f images/s, torchvision "
                      "%.0f (%.2fx)" % (side, side, crop, threads, a, b, a / b), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = ["# The image-folder loader against torchvision's\n",
           "Written by `bench/data_bench.py` (do not edit by hand): %d JPEGs (Fashion-MNIST in "
           "colour, upscaled, quality 90) read once each, in batches of 64, through a training "
           "pipeline (RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize); ours is the "
           "worker's `ReadImageBatch` on N threads, torchvision's is `ImageFolder` + "
           "`DataLoader(num_workers=N)`, each at one intra-op thread. Best of %d runs each, in "
           "the same run, on this machine (%d cores, %s; Python %s).\n" %
           (args.images, args.repeats, os.cpu_count(), platform.machine(),
            platform.python_version()),
           "| images | crop | threads / workers | ours (images/s) | torchvision (images/s) | "
           "ours / torchvision |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for side, crop, threads, a, b in rows:
        out.append("| %dx%d JPEG | %d | %d | %.0f | %.0f | %.2fx |" % (side, side, crop, threads,
                                                                    a, b, a / b))
    out += ["",
            "Per core, ours reads in threads of one process and fills the batch in place; "
            "torchvision's DataLoader runs each worker as a process of its own and sends each "
            "batch back through shared memory. Both decode with libjpeg-turbo and resize with "
            "Pillow's algorithm (ours reimplements it, to the bit).",
            "",
            "The target (at least 2x torchvision's images/s per core) holds for small images; "
            "for 224x224 the decode and Pillow-exact resize dominate and ours is not yet twice "
            "as fast: its resize runs pixel by pixel without SIMD and each step copies the "
            "image (the next work for speed).",
            "",
            "Not measured yet: training samples/s on an image folder against PyTorch DDP with "
            "the same loader, and peak RSS against dataset size under a memory cgroup "
            "(issue 25 asks for both).", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(out))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
