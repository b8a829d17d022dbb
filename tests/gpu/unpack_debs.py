#!/usr/bin/env python3
"""Unpacks Debian packages into a prefix without dpkg (the GPU machine's image
may lack it): a .deb is an ar archive whose data.tar.* holds the files.
Usage: unpack_debs.py PREFIX PACKAGE.deb..."""
import io
import os
import sys
import tarfile


def members(path):
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(path + ": not an ar archive")
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def unpack(prefix, deb):
    for name, data in members(deb):
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                try:
                    tar.extractall(prefix, filter="tar")
                except TypeError:  # a Python without extraction filters
                    tar.extractall(prefix)
            return
    raise ValueError(deb + ": no data.tar")


def main():
    prefix = sys.argv[1]
    os.makedirs(prefix, exist_ok=True)
    for deb in sys.argv[2:]:
        unpack(prefix, deb)
    print("unpacked %d packages into %s" % (len(sys.argv) - 2, prefix))


if __name__ == "__main__":
    main()
