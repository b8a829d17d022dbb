"""Certificates and tokens for the tests, made with the openssl command line
in a temporary folder: a CA, a server certificate for 127.0.0.1 and
localhost, client certificates, and a second, unknown CA with a client
certificate of its own. Nothing is installed; Debian's openssl is enough."""
import os
import secrets
import shutil
import subprocess
import tempfile

ROLES = ("worker", "operator", "admin")


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


class Pki:
    """Files under `dir`: ca.crt; NAME.crt and NAME.key for each certificate
    made; tokens (the coordinator's --tokens_file) and ROLE.token (a client's
    --token_file) for each role in ROLES."""

    def __init__(self):
        if shutil.which("openssl") is None:
            raise RuntimeError("the openssl command is missing: apt-get install openssl")
        self.dir = tempfile.mkdtemp(prefix="ddp-pki-")
        self.ca = self._ca("ca", "ddp test CA")
        self.rogue_ca = self._ca("rogue-ca", "someone else's CA")
        # Server and client use: ddp-run's coordinator presents the same one
        # its workers do.
        self.server = self.cert("server", "coordinator", "ca", san="DNS:localhost,IP:127.0.0.1")
        self.client = self.cert("client", "worker-1", "ca")
        self.rogue_client = self.cert("rogue-client", "intruder", "rogue-ca")
        self.tokens = {role: secrets.token_hex(16) for role in ROLES}
        self.tokens_file = self.path("tokens")
        with open(self.tokens_file, "w") as f:
            f.write("# role token\n")
            for role in ROLES:
                f.write("%s %s\n" % (role, self.tokens[role]))
        os.chmod(self.tokens_file, 0o600)
        self.token_files = {}
        for role in ROLES:
            self.token_files[role] = self.write_token(role, self.tokens[role])

    def path(self, name):
        return os.path.join(self.dir, name)

    def write_token(self, name, token):
        path = self.path(name + ".token")
        with open(path, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
        return path

    def _ca(self, name, cn):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", name + ".key", "-out", name + ".crt", "-days", "2",
                 "-subj", "/CN=" + cn, cwd=self.dir)
        return self.path(name + ".crt")

    def cert(self, name, cn, ca, san=None):
        """Makes NAME.crt/NAME.key signed by `ca` ("ca" or "rogue-ca");
        returns (cert, key) paths."""
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn,
                 cwd=self.dir)
        ext = self.path(name + ".ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\n")
            f.write("extendedKeyUsage=serverAuth,clientAuth\n")
            if san:
                f.write("subjectAltName=%s\n" % san)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
                 "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", ext,
                 cwd=self.dir)
        return self.path(name + ".crt"), self.path(name + ".key")

    def coordinator_flags(self, tokens=True, mutual=True):
        flags = ["--tls_cert=" + self.server[0], "--tls_key=" + self.server[1]]
        if mutual:
            flags.append("--tls_ca=" + self.ca)
        if tokens:
            flags.append("--tokens_file=" + self.tokens_file)
        return flags

    def worker_flags(self, role="worker", client=None):
        cert, key = client or self.client
        flags = ["--tls_ca=" + self.ca, "--tls_cert=" + cert, "--tls_key=" + key]
        if role:
            flags.append("--token_file=" + self.token_files[role])
        return flags

    def client_options(self, role="admin", client=None):
        """ReflectionClient's keyword arguments."""
        cert, key = client or self.client
        return dict(cacert=self.ca, cert=cert, key=key,
                    token=self.tokens[role] if role else None)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)
