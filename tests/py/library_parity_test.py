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
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../chaos"))
import coverage  # noqa: E402
from cluster import Cluster, rank_of_ddp_run  # noqa: E402
from harness import BIN, PYTHON, free_port, read_text, thread_env, wait_for  # noqa: E402

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


def divergent_steps(x):
    """The steps of a --accumulate run on `x` where the `aux` branch (taken
    when a micro-batch's first row has x[0] > 0) is used in the no_sync
    micro-batch on some rank and in the synchronized one on none: where
    PyTorch 1.13 leaves each rank's own un-averaged gradient and its
    replicas drift, while the library averages it (README, "the one
    difference from PyTorch's numbers"). Each as (epoch, the step's first
    position in the epoch, rank 0's first row of the synchronized
    micro-batch)."""
    from torch.utils.data.distributed import DistributedSampler
    steps = []
    for epoch in range(2):
        orders = []
        for rank in range(2):
            sampler = DistributedSampler(range(N), num_replicas=2, rank=rank, seed=7)
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        for start in range(0, N // 2, BATCH):
            first = [x[order[start], 0] > 0 for order in orders]
            second = [x[order[start + BATCH // 2], 0] > 0 for order in orders]
            if any(first) and not any(second):
                steps.append((epoch, start, orders[0][start + BATCH // 2]))
    return steps


def keep_pytorch_replicas_equal(x):
    """`x`, changed where needed so that no step is one of divergent_steps:
    parity is compared only where PyTorch's replicas agree. A synchronized
    micro-batch's first row is made positive until no step is left (only
    ever positive: it ends)."""
    x = x.clone()
    for _ in range(N):
        steps = divergent_steps(x)
        if not steps:
            return x
        for _, _, row in steps:
            x[row, 0] = x[row, 0].abs() + 0.1
    raise AssertionError("could not keep PyTorch's replicas equal")


def read_floats(path):
    with open(path) as f:
        return [float(v) for v in f]


def run_ranks(cmd, world=2, env_extra=None, timeout=300):
    port = str(free_port())
    # As a user starts ranks by hand: one random secret, the same on each.
    secret = secrets.token_hex(16)
    procs = []
    for rank in range(world):
        env = thread_env(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=port, DDP_STORE_SECRET=secret, **(env_extra or {}))
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
        raw = torch.randn(N, INPUTS)
        x = keep_pytorch_replicas_equal(raw)
        y = cls.write_data(cls.dir, x)
        torch.save({"x": x, "y": y}, os.path.join(cls.dir, "data.pt"))
        # The data as drawn, which does hit the divergent case.
        cls.raw_dir = os.path.join(cls.dir, "raw")
        os.makedirs(cls.raw_dir)
        os.symlink(os.path.join(cls.dir, "init"), os.path.join(cls.raw_dir, "init"))
        cls.raw_steps = divergent_steps(raw)
        cls.write_data(cls.raw_dir, raw)
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

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @staticmethod
    def write_data(directory, x):
        """Writes `x` and its labels as the trainer reads them; returns the labels."""
        y = (x[:, :CLASSES].argmax(1) + (x[:, 5] > 1).long()) % CLASSES
        x.numpy().astype("float32").tofile(os.path.join(directory, "x.bin"))
        y.numpy().astype("float32").tofile(os.path.join(directory, "y.bin"))
        with open(os.path.join(directory, "n"), "w") as f:
            f.write(str(N))
        return y

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

    def digests_and_losses(self, tag, outs, directory=None):
        """Each rank's final parameter digest, and rank 0's losses of run TAG
        (in `directory`, the test's own by default)."""
        digests = [re.search(r"rank %d parameter digest (\w+)" % rank, "\n".join(outs)).group(1)
                   for rank in range(2)]
        return digests, read_floats(os.path.join(directory or self.dir, tag + "losses-0.txt"))

    def test_branch_used_only_in_a_no_sync_micro_batch_keeps_replicas_bit_identical(self):
        # Where PyTorch's replicas would drift (a branch some rank used in
        # the no_sync micro-batch, no rank in the synchronized one), ours
        # average it: both ranks end with the same parameters, bit for bit.
        self.assertGreater(len(self.raw_steps), 0, "the data no longer hits the case")
        for backend, env in (("gloo", {}), ("shm", {"LOCAL_WORLD_SIZE": "2"})):
            with self.subTest(backend=backend):
                codes, outs = run_ranks([TRAINER, self.raw_dir, "--accumulate"], env_extra=env,
                                        timeout=120)
                self.assertEqual(codes, [0, 0], "\n".join(outs))
                self.assertIn("done over " + backend, outs[0])
                digests, _ = self.digests_and_losses("acc-", outs, self.raw_dir)
                self.assertEqual(digests[0], digests[1], "replicas differ")

    def test_under_ddp_run_a_program_without_elastic_state_fails_the_job_saying_why(self):
        # A restarted copy joins a re-formed generation, which a program that
        # registered no elastic state can't follow: the job fails at once,
        # naming the cause (it does not start over).
        logs = os.path.join(self.dir, "no-elastic-logs")
        proc = subprocess.Popen([os.path.join(BIN, "ddp-run"), "--nproc=2", "--threads=1",
                                 "--max_restarts=1", "--log_dir=" + logs, "--", TRAINER, self.dir,
                                 "--plain", "--epochs=5000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=thread_env())
        try:
            def rank_one_training():
                if "proven" not in (read_text(os.path.join(logs, "rank-1.log")) or ""):
                    return None
                return rank_of_ddp_run(proc.pid, 1)
            os.kill(wait_for(rank_one_training, 60, "rank 1 to train"), signal.SIGKILL)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        text = out + err
        self.assertNotEqual(proc.returncode, 0, text[-3000:])
        self.assertIn("job program FAILED", text)
        self.assertIn("it registered no elastic state (ddp::Session::set_elastic_state)", text)
        self.assertNotIn("parameter digest", text)  # no copy trained to the end

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

    def test_under_ddp_run_diverged_replicas_fail_the_job_naming_the_parameter(self):
        # Rank 1 nudges one parameter: the coordinator compares the ranks'
        # digests at step 100, names it, fails the job, and each rank's
        # program exits non-zero with that reason (from finish() or its next
        # collective).
        done = subprocess.run([os.path.join(BIN, "ddp-run"), "--nproc=2", "--threads=1",
                               "--max_restarts=0", "--", TRAINER, self.dir, "--diverge"],
                              capture_output=True, text=True, timeout=120, env=thread_env())
        text = done.stdout + done.stderr
        self.assertNotEqual(done.returncode, 0, text[-3000:])
        self.assertIn("replicas diverged: after step 100", text)
        self.assertIn("the parameters that differ: aux.bias (1 of 10)", text)
        self.assertRegex(text, r"error: .*replicas diverged.*aux\.bias")
        # No rank finished as if all were well.
        self.assertNotRegex(text, r"rank \d parameter digest")

    def test_elastic_state_of_a_torchscript_module_travels_to_a_joiner(self):
        # Rank 0 trains alone; a second copy joins the running job and takes
        # up its state (the scripted module's parameters and buffers, and the
        # optimizer's): both end with the same parameters.
        # (admitted as soon as it attaches; rank 0 alone would train for
        # several seconds more)
        cluster = Cluster(job={"name": "scripted", "model": {"kind": "program"},
                               "minWorkers": 1, "maxWorkers": 2, "settleSeconds": 0,
                               "reformMinIntervalSeconds": 0})
        try:
            argv = [TRAINER, self.dir, "--torchscript", "--elastic", "--epochs=400"]
            procs = [cluster.start_program(0, argv)]
            wait_for(lambda: int(cluster.status().get("global_step", 0)) > 20, 60,
                     "rank 0 to train")
            procs.append(cluster.start_program(1, argv))
            for p in procs:
                p.wait(timeout=300)
            logs = [cluster.log("program-%d" % i) for i in range(2)]
            self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(logs))
            self.assertRegex(logs[1], r"took up rank 0's state at step \d+")
            self.assertRegex(logs[1], r"took up the program's own state: program step \d+")
            digests = [re.search(r"parameter digest (\w+)", log).group(1) for log in logs]
            self.assertEqual(digests[0], digests[1])
            cluster.wait_state("JOB_STATE_SUCCEEDED", timeout=30)
        finally:
            cluster.stop()

    def test_a_rank_lost_at_an_epoch_end_reforms_the_others_at_one_point(self):
        # Rank 2 dies after its last batch of the first pass, while rank 0
        # waits in the pass's closing all-reduce and rank 1 is still in its
        # last micro-batch (a step left open across the pass's end): rank 1
        # hears of the loss between collectives. Both must re-form at the
        # same point of the program, the all-reduce, and go on together
        # at the next epoch (the open step's micro-batches are the step in
        # flight). Rank 1 used to re-form at its sampler's end of pass and
        # train the open step again, then run the all-reduce while rank 0
        # trained: "collectives are misaligned".
        for backend in ("gloo", "auto"):
            with self.subTest(backend=backend):
                self.check_lost_across_passes(backend, "--epoch_end_loss")

    def test_a_rank_lost_in_a_step_left_open_across_an_epochs_end_goes_on_at_that_epoch(self):
        # The first pass ends with a micro-batch of an open step, whose
        # backward is the second pass's first batch; rank 2 dies there. The
        # survivors drop the step and go on at the start of the second pass,
        # where their loops are (they used to go back to the first pass's
        # last micro-batch inside their second epoch's loop: from then on
        # each epoch of the program trained the sampler's previous one, and
        # a joiner started an epoch behind the others).
        self.check_lost_across_passes("gloo", "--next_epoch_loss")

    def test_a_passs_last_step_completed_on_one_rank_only_goes_on_together(self):
        # The first pass's last synchronized backward completes on both ranks
        # and reads as failed on rank 1 (DDP_TEST_FAIL_STEP: a ring
        # collective a fault cut between the ranks' last transfers). Rank 0
        # committed the step and waits in the pass's closing all-reduce;
        # rank 1 drops it and re-forms at its sampler into rank 0's state,
        # whose pass is over. The all-reduce the re-formation cut short on
        # rank 0 is the one rank 1 skips, and both go on at the second pass
        # together. (Rank 1 used to run it in the new generation while rank 0
        # trained: "collectives are misaligned", the job failed.)
        cluster = Cluster(job={"name": "partial", "model": {"kind": "program"},
                               "minWorkers": 2, "maxWorkers": 2, "settleSeconds": 0,
                               "reformMinIntervalSeconds": 0})
        index_log = os.path.join(cluster.dir, "partial.idx.jsonl")
        try:
            argv = [TRAINER, self.dir, "--partial_last_step", "--elastic", "--epochs=3"]
            procs = [cluster.start_program(i, argv, DDP_INDEX_LOG=index_log) for i in range(2)]
            for p in procs:
                p.wait(timeout=120)
            logs = [cluster.log("program-%d" % i) for i in range(2)]
            self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(logs))
            by_rank = {int(re.search(r"joined generation 1 of job partial as rank (\d)",
                                     log).group(1)): log for log in logs}
            # 64 steps a pass: step 64 committed on rank 0, dropped on rank 1.
            self.assertIn("step 64 dropped", by_rank[1])
            self.assertNotIn("step 64 dropped", by_rank[0])
            self.assertIn("cut short by a re-formation", by_rank[0])
            self.assertIn("a collective of the program's own skipped", by_rank[1])
            for log in logs:
                self.assertRegex(log, r"re-formed into generation 2 as rank \d of 2 at "
                                      r"step 64 \(epoch 1, cursor 0\)")
                self.assertIn("epoch 2 summed loss", log)
            status = cluster.wait_state("JOB_STATE_SUCCEEDED", timeout=30)
            self.assertEqual(int(status["global_step"]), 3 * 64)
            digests = [re.search(r"parameter digest (\w+)", log).group(1) for log in logs]
            self.assertEqual(digests[0], digests[1])
            # Every sample of every epoch once: the dropped step was rank 0's
            # to keep, and rank 1's copy of it is not trained again.
            coverage.check(coverage.read_lines(index_log), N, 3)
        finally:
            cluster.stop()

    def check_lost_across_passes(self, backend, mode):
        cluster = Cluster(job={"name": "epoch-end", "model": {"kind": "program"},
                               "minWorkers": 2, "maxWorkers": 3, "settleSeconds": 5,
                               "backend": backend})
        try:
            argv = [TRAINER, self.dir, mode, "--elastic", "--epochs=3"]
            procs = [cluster.start_program(i, argv) for i in range(3)]
            for p in procs:
                p.wait(timeout=120)
            logs = [cluster.log("program-%d" % i) for i in range(3)]
            ranks = [int(re.search(r"joined generation 1 of job epoch-end as rank (\d)",
                                   log).group(1)) for log in logs]
            codes = {rank: p.returncode for rank, p in zip(ranks, procs)}
            self.assertEqual(codes, {0: 0, 1: 0, 2: 3}, "\n".join(logs))
            cluster.wait_state("JOB_STATE_SUCCEEDED", timeout=30)
            survivors = [log for rank, log in zip(ranks, logs) if rank != 2]
            for log in survivors:
                # 43 batches a rank: 21 steps, and the open one dropped.
                self.assertRegex(log, r"re-formed into generation 2 as rank \d of 2 at "
                                      r"step 21 \(epoch 1, cursor 0\)")
                self.assertNotIn("the sampler's epoch", log)  # the loop's and the sampler's agree
            digests = [re.search(r"parameter digest (\w+)", log).group(1)
                       for log in survivors]
            self.assertEqual(digests[0], digests[1])
        finally:
            cluster.stop()

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

    def test_rendezvous_refuses_callers_without_the_secret(self):
        """Rank 0's store, torchrun's way, to another local user: StoreSet
        without DDP_STORE_SECRET, or with a guess, is UNAUTHENTICATED and
        never echoes a secret; without one rank 0 doesn't start."""
        import grpc
        secret = secrets.token_hex(16)
        port = str(free_port())
        env = thread_env(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                         DDP_STORE_SECRET=secret, DDP_TIMEOUT_SECONDS="60")
        rank0 = subprocess.Popen([TRAINER, self.dir], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: (rank0.kill(), rank0.communicate()))
        channel = grpc.insecure_channel("127.0.0.1:" + port)
        self.addCleanup(channel.close)
        grpc.channel_ready_future(channel).result(timeout=60)
        store_set = channel.unary_unary("/ddp.v1.Coordinator/StoreSet",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        key = b"shm/mapped/1"
        # StoreSetRequest{job_id: "session", generation: 1, key, value: "x"}
        request = (b"\x0a\x07session\x10\x01\x1a" + bytes([len(key)]) + key + b"\x22\x01x")
        for metadata, words in (((), "none was sent"),
                                ((("ddp-store-token", "guessed-" + "0" * 24),),
                                 "must be the same on every rank")):
            with self.assertRaises(grpc.RpcError) as caught:
                store_set(request, metadata=metadata, timeout=10)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn(words, caught.exception.details())
            self.assertNotIn(secret, caught.exception.details())
            self.assertNotIn("guessed", caught.exception.details())
        self.assertEqual(store_set(request, metadata=(("ddp-store-token", secret),), timeout=10),
                         b"")
        env = {k: v for k, v in env.items() if k != "DDP_STORE_SECRET"}
        env["MASTER_PORT"] = str(free_port())
        run = subprocess.run([TRAINER, self.dir], env=env, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn("DDP_STORE_SECRET is not set", run.stderr)

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
