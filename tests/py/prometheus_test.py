#!/usr/bin/python3
"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes a coordinator and
two workers while they train, and the series are checked through
Prometheus' own query API, as a dashboard would read them: the job's step
moves, the workers' step-time histograms fill, the RPC counters count."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import free_port, wait_for  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class ExampleConfigTest(unittest.TestCase):
    def test_example_config_is_valid(self):
        promtool = shutil.which("promtool")
        if promtool is None:
            self.skipTest("promtool is missing")
        subprocess.run([promtool, "check", "config",
                        os.path.join(REPO, "deploy/prometheus/prometheus.yml")],
                       check=True, capture_output=True, timeout=30)


@unittest.skipUnless(os.path.exists(PROMETHEUS),
                     PROMETHEUS + " is missing (apt-get install prometheus; deploy/setup.sh does)")
class PrometheusScrapeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ddp-prometheus-")
        self.coordinator_port = free_port()
        self.worker_ports = [free_port(), free_port()]
        # Long enough to be scraped many times; cancelled once the checks pass.
        job = synthetic_job("scraped", 2, epochs=50, dataset={
            "kind": "synthetic", "trainSize": 8192, "testSize": 256})
        self.cluster = Cluster(job=job, extra_flags=[
            "--metrics_listen=127.0.0.1:%d" % self.coordinator_port])
        for i, port in enumerate(self.worker_ports):
            self.cluster.start_worker(i, extra=["--metrics_listen=127.0.0.1:%d" % port])
        self.prometheus = None
        self.prom_port = free_port()
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            # JSON is YAML.
            json.dump({
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                           "evaluation_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "ddp-coordinator", "static_configs": [
                        {"targets": ["127.0.0.1:%d" % self.coordinator_port]}]},
                    {"job_name": "ddp-worker", "static_configs": [
                        {"targets": ["127.0.0.1:%d" % p for p in self.worker_ports]}]},
                ]}, f)
        self.prometheus_log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.prometheus = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + config,
             "--storage.tsdb.path=" + os.path.join(self.dir, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % self.prom_port],
            stdout=self.prometheus_log, stderr=subprocess.STDOUT, start_new_session=True)
        self.base = "http://127.0.0.1:%d" % self.prom_port

    def tearDown(self):
        if self.prometheus is not None and self.prometheus.poll() is None:
            self.prometheus.terminate()
            try:
                self.prometheus.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.prometheus.kill()
                self.prometheus.wait()
        self.prometheus_log.close()
        self.cluster.stop()
        if sys.exc_info()[0] is None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def query(self, expr):
        """The instant vector `expr` evaluates to: [(labels, value)]."""
        body = http_get(self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        answer = json.loads(body)
        self.assertEqual(answer["status"], "success", body)
        return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]

    def value(self, expr):
        """The single value of `expr`, or None while it has none."""
        result = self.query(expr)
        return result[0][1] if len(result) == 1 else None

    def wait_value(self, expr, predicate, what, timeout=30):
        last = []

        def check():
            last[:] = [self.value(expr)]
            return last[0] is not None and predicate(last[0])
        try:
            wait_for(check, timeout, what, interval=0.5)
        except AssertionError as e:
            raise AssertionError("%s (last value of %s: %s; prometheus log: %s)" % (
                e, expr, last, open(self.prometheus_log.name).read()[-2000:]))
        return last[0]

    def test_series_exist_and_move(self):
        started = time.time()
        wait_for(lambda: _ready(self.base), 30, "Prometheus to be ready", interval=0.2)
        # All three targets scraped.
        self.wait_value('sum(up{job=~"ddp-.*"})', lambda v: v == 3, "three targets up")
        self.cluster.wait_state("JOB_STATE_RUNNING", timeout=30)

        # The job's step, as Prometheus saw it, moves between scrapes.
        first = self.wait_value("ddp_job_global_step", lambda v: v > 0, "a first step")
        self.wait_value("ddp_job_global_step", lambda v: v > first, "the step to move on")
        self.wait_value('ddp_job_state{state="running"}', lambda v: v == 1, "state running")
        self.wait_value('ddp_coordinator_workers{state="training"}', lambda v: v == 2,
                        "two workers training")
        self.assertEqual(self.value("ddp_job_world_size"), 2)
        self.assertGreater(self.value("ddp_job_samples_per_second"), 0)
        self.assertGreater(self.value("ddp_job_loss"), 0)
        self.assertEqual(self.value('ddp_job_generation_changes_total{cause="start"}'), 1)
        self.assertEqual(self.value("ddp_coordinator_attach_streams"), 2)

        # Each worker's step-time histogram has counts, its parts too, and
        # a rate over the scrapes is positive (the counter moves).
        self.wait_value('count(ddp_worker_step_seconds_count{job="ddp-worker"} > 0)',
                        lambda v: v == 2, "both workers' step histograms to count")
        self.wait_value("count(rate(ddp_worker_steps_total[5s]) > 0)", lambda v: v == 2,
                        "both workers' step counters to move")
        for phase in ("data", "forward", "backward", "allreduce_wait", "optimizer"):
            self.assertEqual(self.value(
                'count(ddp_worker_step_phase_seconds_count{phase="%s"} > 0)' % phase), 2, phase)
        self.assertGreater(self.value(
            "histogram_quantile(0.5, sum by (le) (rate(ddp_worker_step_seconds_bucket[5s])))"), 0)
        self.assertGreater(self.value("sum(ddp_worker_allreduce_bytes_total)"), 0)
        self.assertEqual(sorted(self.value('ddp_worker_rank{instance="127.0.0.1:%d"}' % p)
                                for p in self.worker_ports), [0, 1])

        # RPCs: both workers' streams started; store calls of the Gloo
        # rendezvous and this test's own status reads answered OK.
        self.assertGreaterEqual(self.value(
            'ddp_coordinator_rpcs_started_total{method="ddp.v1.Coordinator/Attach"}'), 2)
        self.assertGreater(self.value(
            'sum(ddp_coordinator_rpcs_handled_total{code="OK", '
            'method=~"ddp.v1.Coordinator/Store.*"})'), 0)
        self.wait_value('ddp_coordinator_rpcs_handled_total{code="OK", '
                        'method="ddp.v1.Coordinator/GetStatus"}', lambda v: v > 0,
                        "GetStatus counted")
        self.assertGreater(self.value(
            'sum(ddp_coordinator_rpc_duration_seconds_count{'
            'method="ddp.v1.Coordinator/GetStatus"})'), 0)

        # Every query of the Grafana dashboard is valid PromQL over these
        # series, and each of its panels shows something.
        with open(os.path.join(REPO, "deploy/grafana/ddp-dashboard.json")) as f:
            dashboard = json.load(f)
        for panel in dashboard["panels"]:
            exprs = [t["expr"].replace("$__rate_interval", "5s") for t in panel["targets"]]
            self.assertTrue(any(self.query(e.replace("[1m]", "[10s]")) for e in exprs),
                            "dashboard panel %r shows nothing: %s" % (panel["title"], exprs))

        self.cluster.client.call("ddp.v1.Coordinator/CancelJob", '{"job_id": "scraped"}')
        self.wait_value('ddp_job_state{state="cancelled"}', lambda v: v == 1,
                        "the cancellation to be scraped")
        print("prometheus_test: checks passed %.1f s after the cluster started" % (
            time.time() - started))


def _ready(base):
    try:
        return "Ready" in http_get(base + "/-/ready", timeout=1)
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
