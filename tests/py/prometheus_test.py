#!/usr/bin/python3
"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes a coordinator and
two workers while they train, and the series are checked through
Prometheus' own query API, as a dashboard would read them: the job's step
moves, the workers' step-time histograms fill, the RPC counters count. Then
the same over HTTPS with client certificates and tokens, as a cluster off
loopback runs it, with the refusals a scraper without them gets."""
import base64
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from certs import Pki  # noqa: E402
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import free_port, wait_for  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")


def http_get(url, timeout=5, context=None, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout, context=context) as r:
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
    # Prometheus' scrape settings beyond the targets (a subclass adds TLS).
    scrape_settings = {}

    def cluster_flags(self):
        """(coordinator flags, worker flags) beyond the metrics addresses."""
        return [], []

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ddp-prometheus-")
        self.coordinator_port = free_port()
        self.worker_ports = [free_port(), free_port()]
        # Long enough to be scraped many times; cancelled once the checks pass.
        job = synthetic_job("scraped", 2, epochs=50, dataset={
            "kind": "synthetic", "trainSize": 8192, "testSize": 256})
        coordinator_flags, worker_flags = self.cluster_flags()
        self.cluster = Cluster(job=job, extra_flags=[
            "--metrics_listen=127.0.0.1:%d" % self.coordinator_port] + coordinator_flags,
            client_options=getattr(self, "client_options", None))
        for i, port in enumerate(self.worker_ports):
            self.cluster.start_worker(i, extra=["--metrics_listen=127.0.0.1:%d" % port] +
                                      worker_flags)
        self.prometheus = None
        self.prom_port = free_port()
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            # JSON is YAML.
            json.dump({
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                           "evaluation_interval": "1s"},
                "scrape_configs": [
                    dict({"job_name": "ddp-coordinator", "static_configs": [
                        {"targets": ["127.0.0.1:%d" % self.coordinator_port]}]},
                        **self.scrape_settings),
                    dict({"job_name": "ddp-worker", "static_configs": [
                        {"targets": ["127.0.0.1:%d" % p for p in self.worker_ports]}]},
                        **self.scrape_settings),
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
        # Each bucket's all-reduce, by launch order: the first has counts.
        self.assertEqual(self.value(
            'count(ddp_worker_bucket_allreduces_total{bucket="0"} > 0)'), 2)
        self.assertGreater(self.value(
            'sum(ddp_worker_bucket_allreduce_bytes_total{bucket="0"})'), 0)
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


class SecuredScrapeTest(PrometheusScrapeTest):
    """Metrics and the status page over HTTPS with client certificates and
    tokens: the coordinator's from its --tls_* and --tokens_file, the
    workers' from --metrics_tls_* and --metrics_tokens_file."""

    @classmethod
    def setUpClass(cls):
        cls.pki = Pki()
        cls.client_options = cls.pki.client_options("admin")
        cls.scrape_settings = {
            "scheme": "https",
            "tls_config": {"ca_file": cls.pki.ca, "cert_file": cls.pki.client[0],
                           "key_file": cls.pki.client[1]},
            "authorization": {"type": "Bearer",
                              "credentials_file": cls.pki.token_files["operator"]}}

    @classmethod
    def tearDownClass(cls):
        cls.pki.remove()

    def cluster_flags(self):
        self.page_port = free_port()
        metrics_tls = ["--metrics_tls_cert=" + self.pki.server[0],
                       "--metrics_tls_key=" + self.pki.server[1],
                       "--metrics_tls_ca=" + self.pki.ca,
                       "--metrics_tokens_file=" + self.pki.tokens_file]
        return (self.pki.coordinator_flags() + ["--http_listen=127.0.0.1:%d" % self.page_port],
                self.pki.worker_flags("worker") + metrics_tls)

    def tls(self, client_cert=True, ca=None):
        context = ssl.create_default_context(cafile=ca or self.pki.ca)
        if client_cert:
            context.load_cert_chain(*self.pki.client)
        return context

    def status(self, url, context=None, token=None, basic=None):
        """The HTTP status `url` answers with (and the response's headers)."""
        headers = {}
        if token:
            headers["Authorization"] = "Bearer " + token
        if basic:
            headers["Authorization"] = "Basic " + base64.b64encode(basic.encode()).decode()
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=5, context=context or self.tls()) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def test_refusals(self):
        tokens = self.pki.tokens
        for port in [self.coordinator_port] + self.worker_ports:
            url = "https://127.0.0.1:%d/metrics" % port
            def served(url=url):
                try:
                    return self.status(url, token=tokens["operator"])[0] == 200
                except OSError:  # not listening yet
                    return False
            wait_for(served, 30, "metrics at " + url)
            code, headers, body = self.status(url)
            self.assertEqual(code, 401, body)
            self.assertIn("Basic", headers.get("WWW-Authenticate", ""))
            self.assertNotIn("ddp_", body)
            self.assertEqual(self.status(url, token=tokens["worker"])[0], 403)
            self.assertEqual(self.status(url, token="x" * 32)[0], 401)
            code, _, body = self.status(url, token=tokens["admin"])
            self.assertEqual(code, 200)
            self.assertIn("# TYPE ddp_", body)
            # mutual TLS: the right token without a client certificate
            code, _, body = self.status(url, self.tls(client_cert=False), token=tokens["admin"])
            self.assertEqual(code, 403, body)
            self.assertIn("client certificate", body)
            # A scraper that doesn't trust our CA stops at the handshake;
            # plain HTTP gets no metrics.
            with self.assertRaises(urllib.error.URLError):
                self.status(url, self.tls(ca=self.pki.rogue_ca), token=tokens["admin"])
            with self.assertRaises((OSError, http.client.HTTPException)):
                http_get("http://127.0.0.1:%d/metrics" % port)

        page = "https://127.0.0.1:%d" % self.page_port
        code, headers, _ = self.status(page + "/")
        self.assertEqual(code, 401)
        self.assertIn('Basic realm="ddp"', headers.get("WWW-Authenticate", ""))
        # What a browser sends once the user typed the token as password.
        code, headers, body = self.status(page + "/", basic="me:" + tokens["operator"])
        self.assertEqual(code, 200)
        self.assertIn("<html", body.lower())
        self.assertIn("default-src 'none'", headers.get("Content-Security-Policy", ""))
        code, _, body = self.status(page + "/api/status", token=tokens["operator"])
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(body)["status"]["jobId"], "scraped")
        self.assertEqual(self.status(page + "/api/status", token=tokens["worker"])[0], 403)



def _ready(base):
    try:
        return "Ready" in http_get(base + "/-/ready", timeout=1)
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
