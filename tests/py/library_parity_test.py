#!/usr/bin/python3
"""The library (ddp::Session, ddp::DistributedDataParallel,
ddp::DistributedSampler) against PyTorch DDP: a C++ model with a
data-dependent branch and one never used, the same model in PyTorch, the
same initial weights, data, sampler and optimizer, two ranks started the
torchrun way (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no coordinator):
every step's loss on every rank equal to 1e-6, the final weights allclose.
Then what a user gets wrong: no environment, models that differ, no_sync
guards nested."""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import BIN, PYTHON, free_port, thread_env  # noqa: E402

TRAINER = os.path.join(BIN, "ddp_library_parity_trainer")
INPUTS, HIDDEN, CLASSES, BATCH, N = 20, 32, 4, 16, 2048  # 64 steps an epoch on 2 ranks
TAGS = {"--accumulate": "acc-", "--torchscript": "ts-"}  # the trainer's output prefixes

# The network of tests/library/parity_trainer.cc, in PyTorch.
NET = r'''
import torch, torch.nn as nn, torch.nn.functional as F
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(20, 32), nn.BatchNorm1d(32), nn.Linear(32, 4)
        self.aux, self.never = nn.Linear(32, 4), nn.Linear(32, 4)
    def forward(self, x):
        h = F.relu(self.bn(self.fc1(x)))
        out = self.fc2(h)
        if x[0][0].item() > 0:
            out = out + self.aux(h)
        return out
'''

# The same loop under PyTorch DDP (find_unused_parameters), rank by rank.
REFERENCE = NET + r'''
import os, sys, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
d = sys.argv[1]
accumulate = len(sys.argv) > 2 and sys.argv[2] == "--accumulate"
tag = TAGS.get(sys.argv[2] if len(sys.argv) > 2 else "", "")
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
net = Net()
with torch.no_grad():
    for name, p in net.named_parameters():
        p.copy_(torch.load(os.path.join(d, "init.pt"))[name])
data = torch.load(os.path.join(d, "data.pt"))
ds = TensorDataset(data["x"], data["y"])
sampler = DistributedSampler(ds, seed=7)
loader = DataLoader(ds, batch_size=16, sampler=sampler)
model = DDP(net, bucket_cap_mb=0.001, find_unused_parameters=True)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
probe_x, probe_y = data["x"][:3], data["y"][:3]
evals = open(os.path.join(d, tag + "ref-eval-%d.txt" % rank), "w")
with open(os.path.join(d, tag + "ref-losses-%d.txt" % rank), "w") as f:
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            with torch.no_grad():  # DDP's forward broadcasts rank 0's buffers first
                net.eval()
                evals.write("%.9g\n" % F.cross_entropy(model(probe_x), probe_y).item())
                net.train()
            opt.zero_grad()
            if accumulate:
                xs, ys = x.chunk(2), y.chunk(2)
                with model.no_sync():
                    first = F.cross_entropy(model(xs[0]), ys[0]) / 2
                    first.backward()
                second = F.cross_entropy(model(xs[1]), ys[1]) / 2
                second.backward()
                value = first.item() + second.item()
            else:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                value = loss.item()
            opt.step()
            f.write("%.9g\n" % value)
if rank == 0:
    torch.save({k: v.detach() for k, v in net.state_dict().items()},
               os.path.join(d, tag + "ref-final.pt"))
dist.destroy_process_group()
'''


def keep_pytorch_replicas_equal(x):
    """`x`, changed where needed so that, under --accumulate, no step uses
    the `aux` branch (taken when a micro-batch's first row has x[0] > 0) in
    the no_sync micro-batch on some rank and in the synchronized one on
    none. There PyTorch 1.13 leaves each rank's own un-averaged gradient and
    its replicas drift, while the library averages it (README, "the one
    difference from PyTorch's numbers"): parity is compared only where
    PyTorch's replicas agree. A synchronized micro-batch's first row is made
    positive until no step is left (only ever positive: it ends)."""
    import torch
    from torch.utils.data.distributed import DistributedSampler
    orders = []
    for epoch in range(2):
        for_ranks = []
        for rank in range(2):
            sampler = DistributedSampler(range(N), num_replicas=2, rank=rank, seed=7)
            sampler.set_epoch(epoch)
            for_ranks.append(list(sampler))
        orders.append(for_ranks)
    x = x.clone()
    for _ in range(N):
        changed = False
        for for_ranks in orders:
            for start in range(0, N // 2, BATCH):
                first = [x[order[start], 0] > 0 for order in for_ranks]
                second = [x[order[start + BATCH // 2], 0] > 0 for order in for_ranks]
                if any(first) and not any(second):
                    row = for_ranks[0][start + BATCH // 2]
                    x[row, 0] = x[row, 0].abs() + 0.1
                    changed = True
        if not changed:
            return x
    raise AssertionError("could not keep PyTorch's replicas equal")


def read_floats(path):
    with open(path) as f:
        return [float(v) for v in f]


def run_ranks(cmd, world=2, env_extra=None, timeout=300):
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = thread_env(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=port, **(env_extra or {}))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], outs


@unittest.skipUnless(os.path.exists(TRAINER), TRAINER + " is not built")
class LibraryParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import torch
        cls.torch = torch
        cls.dir = tempfile.mkdtemp(prefix="ddp-library-")
        torch.manual_seed(11)
        shapes = {"fc1.weight": (HIDDEN, INPUTS), "fc1.bias": (HIDDEN,),
                  "bn.weight": (HIDDEN,), "bn.bias": (HIDDEN,),
                  "fc2.weight": (CLASSES, HIDDEN), "fc2.bias": (CLASSES,),
                  "aux.weight": (CLASSES, HIDDEN), "aux.bias": (CLASSES,),
                  "never.weight": (CLASSES, HIDDEN), "never.bias": (CLASSES,)}
        init = {k: torch.randn(s) * 0.2 for k, s in shapes.items()}
        os.makedirs(os.path.join(cls.dir, "init"))
        for k, t in init.items():
            t.numpy().astype("float32").tofile(os.path.join(cls.dir, "init", k + ".bin"))
        torch.save(init, os.path.join(cls.dir, "init.pt"))
        x = keep_pytorch_replicas_equal(torch.randn(N, INPUTS))
        y = (x[:, :CLASSES].argmax(1) + (x[:, 5] > 1).long()) % CLASSES
        x.numpy().astype("float32").tofile(os.path.join(cls.dir, "x.bin"))
        y.numpy().astype("float32").tofile(os.path.join(cls.dir, "y.bin"))
        with open(os.path.join(cls.dir, "n"), "w") as f:
            f.write(str(N))
        torch.save({"x": x, "y": y}, os.path.join(cls.dir, "data.pt"))
        # The network scripted, with the same initial weights, for --torchscript.
        # (from a file: TorchScript reads the class's source)
        source = os.path.join(cls.dir, "parity_net.py")
        with open(source, "w") as f:
            f.write(NET)
        spec = importlib.util.spec_from_file_location("parity_net", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        net = module.Net()
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(init[name])
        torch.jit.script(net).save(os.path.join(cls.dir, "net.pt"))

    def test_losses_and_weights_match_pytorch_ddp(self):
        # Ranks started by hand without LOCAL_WORLD_SIZE: Gloo over TCP.
        self.check_parity([], {}, "gloo")

    def test_gradient_accumulation_with_no_sync_matches_pytorch_ddp(self):
        # Every rank on this machine, as ddp-run and torchrun say: shared memory.
        self.check_parity(["--accumulate"], {"LOCAL_WORLD_SIZE": "2"}, "shm")

    def test_torchscript_module_matches_pytorch_ddp(self):
        self.check_parity(["--torchscript"], {}, "gloo")

    def check_parity(self, flags, env, backend):
        tag = TAGS.get(flags[0], "") if flags else ""
        codes, outs = run_ranks([TRAINER, self.dir] + flags, env_extra=env)
        self.assertEqual(codes, [0, 0], "\n".join(outs))
        self.assertIn("globally unused", outs[0])
        self.assertIn("done over " + backend, outs[0])
        script = os.path.join(self.dir, "reference.py")
        with open(script, "w") as f:
            f.write("TAGS = %r\n" % TAGS + REFERENCE)
        codes, outs = run_ranks([PYTHON, script, self.dir] + flags)
        self.assertEqual(codes, [0, 0], "\n".join(outs))
        steps = 2 * N // (2 * BATCH)
        for rank in range(2):
            self.assert_same_per_step(tag, "losses-%d.txt" % rank, 1e-6, steps)
            # Eval mode reads the running statistics: equal only if every
            # rank holds rank 0's buffers at each step, as PyTorch's do.
            self.assert_same_per_step(tag, "eval-%d.txt" % rank, 1e-5, steps)
        torch = self.torch
        ref_final = torch.load(os.path.join(self.dir, tag + "ref-final.pt"))
        # Parameters, and the running statistics (rank 0's in both).
        for name, ref in ref_final.items():
            if name.endswith("num_batches_tracked"):
                continue
            ours = torch.from_file(os.path.join(self.dir, tag + "final-%s.bin" % name),
                                   size=ref.numel(), dtype=torch.float32).view(ref.shape)
            self.assertTrue(torch.allclose(ours, ref, atol=1e-6, rtol=1e-5), name)
        # Never used: no gradient, so SGD never moved it, in either.
        self.assertTrue(torch.equal(ref_final["never.weight"],
                                    torch.load(os.path.join(self.dir, "init.pt"))["never.weight"]))

    def assert_same_per_step(self, tag, name, tolerance, steps):
        """Our TAG+NAME and the reference's TAG+ref-NAME hold `steps` values
        each, equal to `tolerance` (relative, or absolute below 1)."""
        ours = read_floats(os.path.join(self.dir, tag + name))
        ref = read_floats(os.path.join(self.dir, tag + "ref-" + name))
        self.assertEqual((len(ours), len(ref)), (steps, steps), tag + name)
        for step, (a, b) in enumerate(zip(ours, ref), start=1):
            self.assertAlmostEqual(a, b, delta=tolerance * max(1.0, abs(b)),
                                   msg="%s%s, step %d" % (tag, name, step))

    def digests_and_losses(self, tag, outs):
        """Each rank's final parameter digest, and rank 0's losses of run TAG."""
        digests = [re.search(r"rank %d parameter digest (\w+)" % rank, "\n".join(outs)).group(1)
                   for rank in range(2)]
        return digests, read_floats(os.path.join(self.dir, tag + "losses-0.txt"))

    def test_a_rank_whose_loss_reaches_no_parameter_takes_part_with_zero_gradients(self):
        # Rank 1's loss reaches no parameter on every third step: it must
        # train exactly as if its loss were the network's times zero (every
        # gradient zero there), on both transports, with replicas bit-equal.
        for backend, env in (("gloo", {}), ("shm", {"LOCAL_WORLD_SIZE": "2"})):
            with self.subTest(backend=backend):
                runs = {}
                for flag, tag in (("--zero_loss_steps", "zl-"), ("--no_param_steps", "np-")):
                    codes, outs = run_ranks([TRAINER, self.dir, flag], env_extra=env, timeout=120)
                    self.assertEqual(codes, [0, 0], "\n".join(outs))
                    self.assertIn("done over " + backend, outs[0])
                    digests, losses = self.digests_and_losses(tag, outs)
                    self.assertEqual(digests[0], digests[1], "replicas differ after " + flag)
                    runs[flag] = (digests[0], losses)
                self.assertEqual(runs["--no_param_steps"], runs["--zero_loss_steps"])

    def test_under_ddp_run_a_rank_whose_loss_reaches_no_parameter_trains_on(self):
        codes, outs = run_ranks([TRAINER, self.dir, "--zero_loss_steps"],
                                env_extra={"LOCAL_WORLD_SIZE": "2"}, timeout=120)
        self.assertEqual(codes, [0, 0], "\n".join(outs))
        expected, _ = self.digests_and_losses("zl-", outs)
        done = subprocess.run([os.path.join(BIN, "ddp-run"), "--nproc=2", "--threads=1", "--",
                               TRAINER, self.dir, "--no_param_steps"],
                              capture_output=True, text=True, timeout=120, env=thread_env())
        self.assertEqual(done.returncode, 0, done.stdout[-3000:] + done.stderr[-3000:])
        digests, _ = self.digests_and_losses("np-", [done.stdout])
        self.assertEqual(digests, expected)
        self.assertIn("job program SUCCEEDED", done.stdout)

    def test_misaligned_collectives_fail_every_rank_naming_what_each_did(self):
        # Rank 1 calls barrier() where rank 0 goes on to its backward: both
        # fail at once, each naming both ranks' collectives, on both
        # transports (not wrong numbers, a hang or an abort).
        for backend, env in (("gloo", {}), ("shm", {"LOCAL_WORLD_SIZE": "2"})):
            with self.subTest(backend=backend):
                codes, outs = run_ranks([TRAINER, self.dir, "--extra_barrier"], env_extra=env,
                                        timeout=120)
                self.assertEqual(codes, [1, 1], "\n".join(outs))
                for out in outs:
                    self.assertIn("collectives are misaligned", out)
                    self.assertRegex(out, r"rank 0 at collective #\d+: the gradients of "
                                          r"synchronized backward #3 ")
                    self.assertRegex(out, r"rank 1 at collective #\d+: barrier after "
                                          r"synchronized backward #2")

    def test_no_environment_says_what_to_set(self):
        env = {k: v for k, v in thread_env().items()
               if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        run = subprocess.run([TRAINER, self.dir], env=env, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(run.returncode, 1)
        self.assertIn("RANK is not set", run.stderr)
        self.assertIn("MASTER_ADDR", run.stderr)
        self.assertIn("ddp-run", run.stderr)

    def test_models_that_differ_fail_on_every_rank_naming_the_parameter(self):
        codes, outs = run_ranks([TRAINER, self.dir, "--mismatch"], timeout=60)
        self.assertEqual(codes, [1, 1], "\n".join(outs))
        for out in outs:
            self.assertIn("the ranks' models differ", out)
            self.assertIn("fc1.weight [32, 20]", out)
        self.assertIn("fc1.weight [33, 20]", outs[1])

    def test_nested_no_sync_is_an_error(self):
        codes, outs = run_ranks([TRAINER, self.dir, "--nested_no_sync"], timeout=60)
        self.assertEqual(codes, [1, 1], "\n".join(outs))
        self.assertIn("guards don't nest", outs[0])


if __name__ == "__main__":
    unittest.main()
