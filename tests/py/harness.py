"""What tests (tests/py, tests/chaos) and benchmarks (bench/) share: where the
binaries are, free ports, bounded waits, the worker's command line, its step
records, and running a job on ddp-run or on the PyTorch reference.

Every wait here has a timeout and names what it waited for."""
import gzip
import json
import os
import random
import socket
import subprocess
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("DDP_BIN", os.path.join(HERE, "../../build/bin"))
# Debian's, with python3-torch; DDP_PYTHON for another (the GPU machine's).
PYTHON = os.environ.get("DDP_PYTHON", "/usr/bin/python3")
REFERENCE = os.path.join(HERE, "../../bench/pytorch_ddp.py")


def thread_env(**extra):
    """The environment for a process that owns one core: OpenMP, OpenBLAS and
    MKL pools sized to 1 (oversubscription is the first thing to rule out in
    a CPU measurement), plus `extra`."""
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                MKL_NUM_THREADS="1", **extra)


_PORTS_GIVEN = set()


def free_port():
    """A loopback port nobody listens on now, for servers that can't be
    given port 0. Drawn from 20000-28999: below the kernel's ephemeral range
    (32768 up), so that no connect() or port-0 bind of the processes a test
    starts can take it before the server binds it (one from that range
    may be), and apart from the project's default ports (29400, 9400-9420)."""
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(20000, 29000)
        if port in _PORTS_GIVEN:  # to this process already: not twice
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- waiting


def wait_for(predicate, timeout, what, interval=0.05):
    """Polls `predicate` until it returns something true, and returns that;
    AssertionError after `timeout` seconds. RPC errors count as not yet (a
    server may still be starting)."""
    deadline = time.time() + timeout
    last_error = None
    while time.time() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except grpc.RpcError as e:
            last_error = e
        time.sleep(interval)
    raise AssertionError("timed out after %.0fs waiting for %s%s" % (
        timeout, what, " (last error: %s)" % last_error.details() if last_error else ""))


def _exited(proc, what):
    if proc is not None and proc.poll() is not None:
        raise AssertionError("%s: the process exited with %d" % (what, proc.returncode))


def read_text(path):
    """The file's text, stripped; None while it does not exist."""
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def wait_port_file(path, timeout, what, proc=None):
    """The port a server wrote to `path` (its --port_file), once written;
    gives up at once if `proc` (the server) exits first."""
    def port():
        text = read_text(path)
        if not text:
            _exited(proc, what)
        return int(text) if text else None
    return wait_for(port, timeout, what)


def wait_listening(host, port, timeout, what, proc=None):
    """Until a TCP connection to host:port succeeds (the server listens)."""
    def connects():
        _exited(proc, what)
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return True
        except OSError:
            return False
    wait_for(connects, timeout, what, interval=0.02)


# ---------------------------------------------------------------- workers

# The uint64 fields of StepReport and ReductionStatus: protobuf's JSON
# mapping writes them as strings.
_UINT64 = {"generation", "epoch", "step", "step_in_epoch", "steps_per_epoch", "samples",
           "cursor", "dataset_size", "total_steps", "bytes"}


def read_step_records(path):
    """The ddp.v1.StepRecord lines a worker's --metrics_file (or the PyTorch
    reference's --metrics) holds, as flat dicts, in file order.

    Flat: a record's `time` and `rank`, its `report`'s fields, and the
    fields of the report's `reduction` and `timings` lifted beside them
    (StepRecord{time, rank, report{step, reduction{wait_ms}}} becomes
    {time, rank, step, wait_ms}; no two of these fields share a name), with
    uint64 fields as ints (JSON strings from protobuf, numbers from the
    reference). Missing file: no records."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            flat = dict(record["report"], time=record["time"], rank=record["rank"])
            for part in ("reduction", "timings"):
                flat.update(flat.pop(part, {}))
            records.append({k: int(v) if k in _UINT64 else v for k, v in flat.items()})
    return records


def samples_per_second(ranks):
    """Throughput over the training loop, summed over ranks (each a list of
    step records): a rank's samples over its loop's wall time, from the first
    step's start to the last step's end. The same rule for ours and the
    reference, so their rates compare."""
    rate = 0.0
    for records in ranks:
        seconds = records[-1]["time"] - records[0]["time"] + records[0]["step_seconds"]
        rate += sum(r["samples"] for r in records) / seconds
    return rate


class RunFolder:
    """A folder where a run's processes write `<name>.log` and its workers
    their step records, `<name>.jsonl`."""

    def __init__(self, folder):
        self.dir = folder

    def log(self, name):
        with open(os.path.join(self.dir, name + ".log")) as f:
            return f.read()

    def metrics(self, name):
        """Worker `name`'s step records (read_step_records)."""
        return read_step_records(os.path.join(self.dir, name + ".jsonl"))

    def worker_command(self, coordinator, index, name, host="127.0.0.1", extra=()):
        """ddp-worker on cpu:`index` with one thread, writing its step
        records into this folder; `extra` flags last (they win)."""
        return [os.path.join(BIN, "ddp-worker"), "--coordinator=" + coordinator,
                "--device=cpu:%d" % index, "--host=" + host, "--name=" + name, "--threads=1",
                "--metrics_file=" + os.path.join(self.dir, name + ".jsonl")] + list(extra)


def _tail(path, limit=3000):
    return (read_text(path) or "")[-limit:]


def run_ddp_run(job_file, nproc, folder, worker_args="", timeout=600):
    """Runs the job file on `ddp-run --nproc` with one thread per worker, its
    logs in `folder`; returns each rank's step records. RuntimeError, with
    the output's tail, if it fails or outlasts `timeout` seconds."""
    args = ["--job=" + job_file, "--log_dir=" + folder]
    if worker_args:
        args.append("--worker_args=" + worker_args)
    _ddp_run(nproc, args, folder, timeout)
    return [read_step_records(os.path.join(folder, "metrics-w%d.jsonl" % rank))
            for rank in range(nproc)]


def run_program(argv, nproc, folder, timeout=600):
    """Runs `ddp-run --nproc N --threads 1 -- argv` (a program on the ddp
    library), its output in `folder`/ddp-run.log. RuntimeError, with the
    output's tail, if it fails or outlasts `timeout` seconds."""
    _ddp_run(nproc, ["--"] + list(argv), folder, timeout)


def _ddp_run(nproc, args, folder, timeout):
    """ddp-run --nproc N --threads 1 ARGS, its output in `folder`/ddp-run.log."""
    cmd = [os.path.join(BIN, "ddp-run"), "--nproc=%d" % nproc, "--threads=1"] + args
    output = os.path.join(folder, "ddp-run.log")
    try:
        with open(output, "w") as log:
            subprocess.run(cmd, env=thread_env(), stdout=log, stderr=subprocess.STDOUT,
                           timeout=timeout, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise RuntimeError("%s\n%s" % (e, _tail(output))) from None


def run_reference(job_file, nproc, folder, extra=(), timeout=600):
    """Runs the job file on the PyTorch reference (bench/pytorch_ddp.py), one
    process per rank with env:// variables (Debian's torchrun fails on Python
    3.11), logs and step records in `folder`; returns each rank's step
    records. If a rank fails, the others are killed and RuntimeError says
    why; AssertionError after `timeout` seconds."""
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        env = thread_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(nproc),
                         RANK=str(rank))
        with open(os.path.join(folder, "reference-%d.log" % rank), "w") as log:
            procs.append(subprocess.Popen(
                [PYTHON, REFERENCE, "--job", job_file, "--threads", "1",
                 "--metrics", os.path.join(folder, "reference-%d.jsonl" % rank)] + list(extra),
                env=env, stdout=log, stderr=subprocess.STDOUT))

    def finished():
        for rank, p in enumerate(procs):
            if p.poll() not in (None, 0):
                raise RuntimeError("PyTorch reference rank %d exited with %d:\n%s" % (
                    rank, p.returncode, _tail(os.path.join(folder, "reference-%d.log" % rank))))
        return all(p.poll() == 0 for p in procs)
    try:
        wait_for(finished, timeout, "the PyTorch reference's %d rank(s) to finish" % nproc,
                 interval=0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [read_step_records(os.path.join(folder, "reference-%d.jsonl" % rank))
            for rank in range(nproc)]


# ---------------------------------------------------------------- data

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


def read_idx(path):
    """A gzipped IDX file (MNIST's format) as a uint8 tensor."""
    import torch  # only the runs that load data pay for it
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load_dataset(spec, seed):
    """A job spec's dataset as (train_x, train_y, test_x, test_y), exactly as
    worker/dataset.cc makes it: for the PyTorch reference and the tests that
    compare with it."""
    import torch
    kind = spec.get("kind", "fashion-mnist")
    if kind == "fashion-mnist":
        d = spec.get("path", "/usr/share/datasets/fashion-mnist")
        norm = lambda x: ((x.to(torch.float32) / 255.0 - FASHION_MEAN) / FASHION_STD).unsqueeze(1)
        tx = read_idx(d + "/train-images-idx3-ubyte.gz")
        ty = read_idx(d + "/train-labels-idx1-ubyte.gz")
        vx = read_idx(d + "/t10k-images-idx3-ubyte.gz")
        vy = read_idx(d + "/t10k-labels-idx1-ubyte.gz")
        out = [norm(tx), ty.to(torch.int64), norm(vx), vy.to(torch.int64)]
    elif kind == "synthetic":
        n_train = int(spec.get("trainSize", 4096))
        n = n_train + int(spec.get("testSize", 1024))
        g = torch.Generator()
        g.manual_seed(seed)
        prototypes = torch.randn(10, 1, 28, 28, generator=g) * 0.3
        y = torch.randint(10, (n,), generator=g)
        x = prototypes.index_select(0, y) + torch.randn(n, 1, 28, 28, generator=g)
        return x[:n_train].contiguous(), y[:n_train].contiguous(), x[n_train:], y[n_train:]
    elif kind == "tensors":
        tx, ty = torch.load(spec["path"])
        vx, vy = torch.load(spec["testPath"]) if spec.get("testPath") else (None, None)
        out = [tx.to(torch.float32), ty.to(torch.int64), vx, vy]
    else:
        raise ValueError("unknown dataset kind " + kind)
    size = int(spec.get("trainSize", 0))
    if size:
        out[0], out[1] = out[0][:size].contiguous(), out[1][:size].contiguous()
    return tuple(out)
