#!/usr/bin/python3
"""deploy/systemd's units pass `systemd-analyze verify`, pointed at the binaries
just built (verify checks that ExecStart's program exists), with the worker
template instantiated as ddp-worker@0."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from cluster import BIN  # noqa: E402

UNITS = os.path.join(os.path.dirname(__file__), "../../deploy/systemd")


class SystemdUnitsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ddp-units-")
        for name in ("ddp-coordinator.service", "ddp-worker@.service"):
            with open(os.path.join(UNITS, name)) as f:
                text = f.read().replace("/usr/local/bin/", os.path.abspath(BIN) + "/")
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)

    def verify(self, *units):
        return subprocess.run(
            ["systemd-analyze", "verify"] + [os.path.join(self.dir, u) for u in units],
            capture_output=True, text=True, cwd=self.dir)

    def test_units_verify_cleanly(self):
        self.assertIsNotNone(shutil.which("systemd-analyze"), "install Debian's systemd")
        result = self.verify("ddp-coordinator.service", "ddp-worker@0.service")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr.strip(), "")

    def test_worker_instance_owns_its_gpu(self):
        with open(os.path.join(self.dir, "ddp-worker@.service")) as f:
            text = f.read()
        self.assertIn("--device=cuda:%i", text)
        self.assertIn("Restart=always", text)

    def test_verify_catches_a_missing_program(self):
        path = os.path.join(self.dir, "ddp-worker@.service")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace("ddp-worker --coordinator", "ddp-wurker --coordinator"))
        self.assertNotEqual(self.verify("ddp-worker@0.service").returncode, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
