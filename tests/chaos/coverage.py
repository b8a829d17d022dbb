"""Every sample once: reads the workers' index logs (ddp-worker --index_log)
and says, per epoch, which dataset indices were trained in committed steps,
how many times.

A rank logs a step's indices before the step runs, so a rank killed in the
step still leaves its line. Whether a step was committed is decided by what
came after it: a later generation that starts from step s continues the
state after step s, so earlier steps up to s were committed and those past
it were discarded. Every step of the last generation was committed (the job
ended).
"""
import collections
import glob
import json


def read_lines(pattern, markers=None):
    """The step lines of the index logs matching `pattern`; the generation
    start markers (a generation's `starts_after_step`) go to `markers`, a
    list, when given."""
    lines = []
    for path in glob.glob(pattern):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                record = json.loads(line)
                if "indices" in record:
                    lines.append(record)
                elif markers is not None:
                    markers.append(record)
    return lines


def committed_lines(lines):
    """The lines of committed steps, and {generation: start step}.

    Generations in order: one that starts from step s continues the state
    after step s, so every line kept so far for a step past s was not
    committed (the step in flight at a fault, or the steps after a
    checkpoint that a whole-job restart went back to)."""
    by_gen = collections.defaultdict(list)
    for line in lines:
        by_gen[line["generation"]].append(line)
    gens = sorted(by_gen)
    start = {g: min(l["step"] for l in by_gen[g]) - 1 for g in gens}
    kept = []
    for g in gens:
        kept = [l for l in kept if l["step"] <= start[g]]
        kept.extend(by_gen[g])
    return kept, start


def coverage(lines, dataset_size, epochs):
    """Per epoch: (missing indices, {index: times} for indices trained more
    than once, the largest world size of the epoch's generations)."""
    kept, _ = committed_lines(lines)
    # One line per (generation, rank, step): a step redone in a later
    # generation under the same number is another line, and counts.
    result = {}
    for epoch in range(epochs):
        counts = collections.Counter()
        worlds = set()
        for l in kept:
            if l["epoch"] == epoch:
                counts.update(l["indices"])
                worlds.add(l["world_size"])
        missing = [i for i in range(dataset_size) if counts[i] == 0]
        repeated = {i: c for i, c in counts.items() if c > 1}
        result[epoch] = (missing, repeated, max(worlds) if worlds else 0)
    return result


def check(lines, dataset_size, epochs):
    """Raises AssertionError unless every epoch trained every index, and
    repeated only the padding of an epoch's last generation (fewer than its
    world size)."""
    for epoch, (missing, repeated, world) in coverage(lines, dataset_size, epochs).items():
        assert not missing, "epoch %d: %d indices never trained, e.g. %s" % (
            epoch, len(missing), missing[:10])
        extra = sum(c - 1 for c in repeated.values())
        assert extra < max(world, 1), "epoch %d: %d samples trained more than once: %s" % (
            epoch, extra, dict(list(repeated.items())[:10]))
