#!/usr/bin/python3
"""The image-folder loader against torchvision (python3-torchvision 0.14,
the reference): an image folder made from Fashion-MNIST (PNGs and JPEGs,
grey and colour, palette and alpha, 16-bit grey, CMYK, upscaled copies, a nested folder, an
upper-case extension, files that are no image), read by
build/bin/ddp_image_folder_probe and by torchvision's ImageFolder.

- Index i names the same file and label in both, for every index.
- Decoded tensors (ToTensor) are equal: exactly for PNG, and for JPEG within
  one grey level (both decode with libjpeg-turbo's defaults; the test says
  how far apart they are).
- CenterCrop (smaller than the image, larger than it: zero padding, and an
  odd margin that Python rounds to even) and Normalize give the same
  tensors as torchvision's transforms.
- Bad input is refused naming the file or class: a truncated JPEG, a
  corrupt PNG, an empty class folder, a .bmp (torchvision would read it,
  this loader can't), a file that is no image under an image's name."""
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from PIL import Image
import torch
from torchvision import datasets, transforms

sys.path.insert(0, os.path.dirname(__file__))
from harness import BIN  # noqa: E402

PROBE = os.path.join(BIN, "ddp_image_folder_probe")
FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
LABELS = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
CLASSES = ["0-tshirt", "1-trouser", "2-pullover", "3-dress", "4-coat", "5-sandal", "6-shirt",
           "7-sneaker", "8-bag", "9-boot"]
COUNT = 300
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def fashion(count):
    with gzip.open(FASHION) as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        x = np.frombuffer(f.read(count * rows * cols), np.uint8).reshape(count, rows, cols)
    with gzip.open(LABELS) as f:
        f.read(8)
        y = np.frombuffer(f.read(count), np.uint8)
    return x, y


def write_folder(root):
    """Fashion-MNIST's first COUNT images in ten class folders, in five
    kinds by index; plus a nested folder, an upper-case extension and files
    torchvision leaves out."""
    x, y = fashion(COUNT)
    for c in CLASSES:
        os.makedirs(os.path.join(root, c))
    os.makedirs(os.path.join(root, CLASSES[3], "more b"))
    for i in range(COUNT):
        grey = Image.fromarray(x[i], "L")
        folder = os.path.join(root, CLASSES[y[i]])
        if i % 17 == 0 and y[i] == 3:
            folder = os.path.join(folder, "more b")
        kind = i % 5
        name = os.path.join(folder, "img%04d" % i)
        if kind == 0:
            grey.save(name + ".png")
        elif kind == 1:
            grey.save(name + ".jpg", quality=90)
        elif kind == 2:  # colour, upscaled: 56 x 56
            rgb = Image.merge("RGB", (grey, grey.point(lambda v: v // 2),
                                      grey.point(lambda v: 255 - v))).resize((56, 56))
            rgb.save(name + ".PNG")
        elif kind == 3:  # colour JPEG, 4:2:0, 57 x 55 (odd sides)
            rgb = Image.merge("RGB", (grey.point(lambda v: 255 - v), grey,
                                      grey.point(lambda v: v // 3))).resize((57, 55))
            rgb.save(name + ".jpeg", quality=85)
        else:  # palette, or grey with alpha
            if i % 2:
                grey.convert("RGB").convert("P", palette=Image.ADAPTIVE, colors=16).save(
                    name + ".png")
            else:
                la = Image.merge("LA", (grey, grey.point(lambda v: 255 - v)))
                la.save(name + ".png")
    # 16-bit grey, which PIL clips to 255 rather than take its high byte
    # (values here up to 765: some kept, some clipped).
    Image.fromarray(x[0].astype(np.uint16) * 3).save(os.path.join(root, CLASSES[5], "deep.png"))
    # CMYK, as ImageNet has a few (PIL writes Adobe's inverted form).
    Image.merge("RGB", (Image.fromarray(x[1], "L"), Image.fromarray(x[2], "L"),
                        Image.fromarray(x[3], "L"))).convert("CMYK").save(
        os.path.join(root, CLASSES[6], "print.jpg"), quality=90)
    with open(os.path.join(root, CLASSES[0], "notes.txt"), "w") as f:
        f.write("not an image, and not named as one")
    with open(os.path.join(root, "README"), "w") as f:
        f.write("a file beside the class folders")


def probe(root, indices=(), crop=None, normalize=False, ops=()):
    """(lines, tensors by index) from the probe; raises CalledProcessError
    with its stderr when it refuses the folder. `ops`: the probe's own
    transform arguments, applied in order."""
    out = os.path.join(tempfile.mkdtemp(prefix="ddp-probe-"), "t.bin")
    args = [PROBE, root, out] + [str(a) for a in ops]
    if crop:
        args += ["--crop", str(crop[0]), str(crop[1])]
    if normalize:
        args += ["--normalize"] + [str(v) for v in MEAN + STD]
    args += [str(i) for i in indices]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, args, proc.stdout, proc.stderr)
    lines = [json.loads(l) for l in proc.stdout.splitlines()]
    with open(out, "rb") as f:
        data = f.read()
    shutil.rmtree(os.path.dirname(out))
    tensors = {}
    for l in lines:
        if "shape" in l:
            n = int(np.prod(l["shape"]))
            tensors[l["index"]] = torch.from_numpy(
                np.frombuffer(data, np.float32, n, l["offset"]).reshape(l["shape"]).copy())
    return lines, tensors


class ImageFolderParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="ddp-imagefolder-")
        write_folder(cls.root)
        cls.reference = datasets.ImageFolder(cls.root)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def test_every_index_names_the_same_file_and_label(self):
        lines, _ = probe(self.root)
        self.assertEqual(len(lines), COUNT + 2)  # Fashion-MNIST's, deep.png and print.jpg
        self.assertEqual([(l["path"], l["label"]) for l in lines],
                         [(p, c) for p, c in self.reference.samples])

    def compare(self, transform, crop=None, normalize=False, ops=()):
        indices = list(range(0, COUNT, 7)) + list(range(1, 40)) + [
            i for i, (p, _) in enumerate(self.reference.samples)
            if p.endswith(("deep.png", "print.jpg"))]
        _, got = probe(self.root, indices, crop, normalize, ops)
        worst = {"png": 0.0, "jpeg": 0.0}
        for i in indices:
            path = self.reference.samples[i][0]
            want = transform(self.reference.loader(path))
            self.assertEqual(tuple(got[i].shape), tuple(want.shape), path)
            diff = float((got[i] - want).abs().max())
            kind = "png" if path.lower().endswith(".png") else "jpeg"
            worst[kind] = max(worst[kind], diff)
            if kind == "png":
                self.assertEqual(diff, 0.0, path)
        print("largest difference from torchvision: PNG %g, JPEG %g" %
              (worst["png"], worst["jpeg"]), flush=True)
        scale = 1.0 / min(STD) if normalize else 1.0
        self.assertLessEqual(worst["jpeg"], scale * (1.0 / 255) + 1e-6)

    def test_decoded_tensors_equal_torchvisions(self):
        self.compare(transforms.ToTensor())

    def test_center_crop_and_normalize_equal_torchvisions(self):
        for h, w in ((24, 24), (51, 50), (64, 60)):
            with self.subTest(crop=(h, w)):
                self.compare(transforms.Compose([transforms.CenterCrop((h, w)),
                                                 transforms.ToTensor(),
                                                 transforms.Normalize(MEAN, STD)]),
                             crop=(h, w), normalize=True)

    def test_resize_flip_and_crops_equal_torchvisions(self):
        """Resize is Pillow's (antialiased bilinear, fixed point): up, down,
        to a shorter side; a crop at a given place and a flip are
        RandomResizedCrop's and RandomHorizontalFlip's work once their
        parameters are drawn."""
        f = transforms.functional
        cases = [
            (["--resize", 40, 36], transforms.Resize((40, 36))),
            (["--resize", 13, 19], transforms.Resize((13, 19))),
            (["--resize_shorter", 45], transforms.Resize(45)),
            (["--resize_shorter", 17], transforms.Resize(17)),
            (["--crop_at", 3, 5, 20, 17, "--resize", 32, 32],
             lambda im: f.resized_crop(im, 3, 5, 20, 17, [32, 32])),
            (["--hflip", "--crop", 24, 24], lambda im: f.center_crop(f.hflip(im), [24, 24])),
        ]
        for ops, transform in cases:
            with self.subTest(ops=ops):
                self.compare(transforms.Compose([transform, transforms.ToTensor()]), ops=ops)

    def refused(self, root, index=None):
        with self.assertRaises(subprocess.CalledProcessError) as cm:
            probe(root, [] if index is None else [index])
        self.assertEqual(cm.exception.returncode, 2)
        return cm.exception.stderr

    def test_bad_input_is_refused_naming_the_file_or_class(self):
        work = tempfile.mkdtemp(prefix="ddp-badfolder-")
        self.addCleanup(shutil.rmtree, work, True)
        root = os.path.join(work, "data")
        shutil.copytree(self.root, root)
        samples = datasets.ImageFolder(root).samples
        jpeg = next(i for i, (p, _) in enumerate(samples) if p.endswith(".jpg"))
        png = next(i for i, (p, _) in enumerate(samples) if p.endswith(".png"))
        # A truncated JPEG.
        with open(samples[jpeg][0], "rb") as f:
            data = f.read()
        with open(samples[jpeg][0], "wb") as f:
            f.write(data[:len(data) // 2])
        self.assertIn(samples[jpeg][0], self.refused(root, jpeg))
        self.assertIn("truncated", self.refused(root, jpeg))
        # A PNG whose image data is damaged (its CRC no longer matches).
        with open(samples[png][0], "rb") as f:
            data = bytearray(f.read())
        idat = data.find(b"IDAT")
        data[idat + 8] ^= 0xff
        with open(samples[png][0], "wb") as f:
            f.write(data)
        self.assertIn(samples[png][0], self.refused(root, png))
        # A text file under an image's name.
        fake = os.path.join(root, CLASSES[1], "zzz.png")
        with open(fake, "w") as f:
            f.write("hello")
        index = [p for p, _ in datasets.ImageFolder(root).samples].index(fake)
        self.assertIn("neither a JPEG nor a PNG", self.refused(root, index))
        # An image torchvision would read and this loader can't.
        bmp = os.path.join(root, CLASSES[2], "photo.bmp")
        Image.new("RGB", (4, 4)).save(bmp)
        self.assertIn(bmp, self.refused(root))
        os.remove(bmp)
        # An empty class folder: torchvision refuses it too.
        os.makedirs(os.path.join(root, "9z-empty"))
        self.assertIn("9z-empty", self.refused(root))
        with self.assertRaises(FileNotFoundError):
            datasets.ImageFolder(root)


if __name__ == "__main__":
    unittest.main(verbosity=2)
