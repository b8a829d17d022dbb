#!/usr/bin/python3
"""A reflection-driven gRPC client that is given no .proto file, as grpcurl is.

It learns every message type from the server's reflection service, then calls
methods with JSON in and JSON out. Used by the tests to prove that operators
can query the coordinator with nothing but its address:

    grpc_reflect.py 127.0.0.1:29400 list
    grpc_reflect.py 127.0.0.1:29400 call ddp.v1.Coordinator/GetStatus '{}'
    grpc_reflect.py 127.0.0.1:29400 call grpc.health.v1.Health/Check '{}'

Over TLS, and with a bearer token, as grpcurl's -cacert/-cert/-key/-H:

    grpc_reflect.py --cacert ca.crt --cert op.crt --key op.key --token-file op.token \
        HOST:29400 call ddp.v1.Coordinator/GetStatus
"""
import argparse
import json
import os
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

_REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
# What only a worker token may call (coordinator/authorizer.h).
_WORKER_METHODS = {"Attach", "StoreSet", "StoreGet", "StoreAdd"}


def _reflection_messages():
    """The reflection protocol's own messages: the one schema a client must know."""
    f = descriptor_pb2.FileDescriptorProto(
        name="client/reflection.proto", package="grpc.reflection.v1alpha", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def message(name, fields):
        m = f.message_type.add(name=name)
        for number, field_name, kind, type_name, repeated in fields:
            field = m.field.add(name=field_name, number=number, type=kind,
                                label=T.LABEL_REPEATED if repeated else T.LABEL_OPTIONAL)
            if type_name:
                field.type_name = ".grpc.reflection.v1alpha." + type_name

    message("ServerReflectionRequest", [
        (1, "host", T.TYPE_STRING, None, False),
        (3, "file_by_filename", T.TYPE_STRING, None, False),
        (4, "file_containing_symbol", T.TYPE_STRING, None, False),
        (7, "list_services", T.TYPE_STRING, None, False)])
    message("FileDescriptorResponse", [(1, "file_descriptor_proto", T.TYPE_BYTES, None, True)])
    message("ServiceResponse", [(1, "name", T.TYPE_STRING, None, False)])
    message("ListServiceResponse", [(1, "service", T.TYPE_MESSAGE, "ServiceResponse", True)])
    message("ErrorResponse", [(1, "error_code", T.TYPE_INT32, None, False),
                              (2, "error_message", T.TYPE_STRING, None, False)])
    message("ServerReflectionResponse", [
        (1, "valid_host", T.TYPE_STRING, None, False),
        (4, "file_descriptor_response", T.TYPE_MESSAGE, "FileDescriptorResponse", False),
        (6, "list_services_response", T.TYPE_MESSAGE, "ListServiceResponse", False),
        (7, "error_response", T.TYPE_MESSAGE, "ErrorResponse", False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    get = lambda name: factory.GetPrototype(
        pool.FindMessageTypeByName("grpc.reflection.v1alpha." + name))
    return get("ServerReflectionRequest"), get("ServerReflectionResponse")


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds fixed metadata (the bearer token) to every call, as ddp's own
    clients do; plaintext loopback included, where gRPC's call credentials
    would refuse to send it."""

    def __init__(self, pairs, token_for=None):
        """`token_for`: method name -> the bearer token to send with it."""
        self.pairs = list(pairs)
        self.token_for = token_for

    def _with(self, details):
        fields = ["method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"]
        values = {f: getattr(details, f, None) for f in fields}
        pairs = self.pairs
        if self.token_for is not None:
            pairs = pairs + [("authorization", "Bearer " + self.token_for(details.method))]
        values["metadata"] = list(values["metadata"] or []) + pairs
        return _CallDetails(**values)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def local_token_file(target, role="admin"):
    """The token a coordinator of this user's serving on `target` (a loopback
    HOST:PORT) made for `role`, as common/local_tokens.h writes it; None
    when there is none."""
    host, _, port = target.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "[::1]") or not port.isdigit():
        return None
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    folder = runtime + "/ddp" if runtime.startswith("/") else "/tmp/ddp-%d" % os.geteuid()
    path = "%s/coordinator-%s-%s.token" % (folder, port, role)
    return path if os.path.exists(path) else None


class ReflectionClient:
    def __init__(self, target, cacert=None, cert=None, key=None, token=None, local_token=True):
        """`cacert`, `cert`, `key`: PEM file paths for TLS (any one turns it
        on); `token`: sent as "authorization: Bearer <token>" on every call;
        without one, the admin token of a local coordinator of this user's
        (unless `local_token` is false: an anonymous caller)."""
        by_method = None
        if token is None and local_token:
            # A local coordinator's own tokens: the worker's for what only
            # a worker may call, the admin's for the rest.
            paths = {role: local_token_file(target, role) for role in ("admin", "worker")}
            if all(paths.values()):
                tokens = {}
                for role, path in paths.items():
                    with open(path) as f:
                        tokens[role] = f.read().strip()
                by_method = lambda method: tokens[  # noqa: E731
                    "worker" if method.rsplit("/", 1)[-1] in _WORKER_METHODS else "admin"]
        # Reconnect quickly: tests restart servers and watch them come back.
        options = [("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if cacert or cert or key:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(cacert) if cacert else None,
                private_key=_read(key) if key else None,
                certificate_chain=_read(cert) if cert else None)
            self.channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(target, options=options)
        if token is not None:
            self.channel = grpc.intercept_channel(
                self.channel, _Metadata([("authorization", "Bearer " + token)]))
        elif by_method is not None:
            self.channel = grpc.intercept_channel(self.channel, _Metadata([], by_method))
        self._request, self._response = _reflection_messages()
        self._info = self.channel.stream_stream(
            _REFLECTION, request_serializer=self._request.SerializeToString,
            response_deserializer=self._response.FromString)
        self.pool = descriptor_pool.DescriptorPool()
        self.factory = message_factory.MessageFactory(self.pool)
        self._files = set()

    def close(self):
        self.channel.close()

    def _ask(self, **kwargs):
        response = next(iter(self._info(iter([self._request(**kwargs)]), timeout=10)))
        if response.HasField("error_response"):
            raise LookupError(response.error_response.error_message)
        return response

    def list_services(self):
        response = self._ask(list_services="*")
        return sorted(s.name for s in response.list_services_response.service)

    def _load(self, symbol):
        """Adds the file defining `symbol`, and its dependencies, to the pool."""
        response = self._ask(file_containing_symbol=symbol)
        pending = [descriptor_pb2.FileDescriptorProto.FromString(b)
                   for b in response.file_descriptor_response.file_descriptor_proto]
        while pending:
            progress = False
            for f in list(pending):
                if f.name in self._files:
                    pending.remove(f)
                    continue
                if all(d in self._files for d in f.dependency):
                    self.pool.Add(f)
                    self._files.add(f.name)
                    pending.remove(f)
                    progress = True
            if pending and not progress:
                # Dependencies the server sent on an earlier request.
                for f in pending:
                    for d in f.dependency:
                        if d not in self._files:
                            self._load_file(d)
        return self.pool

    def _load_file(self, filename):
        response = self._ask(file_by_filename=filename)
        for b in response.file_descriptor_response.file_descriptor_proto:
            f = descriptor_pb2.FileDescriptorProto.FromString(b)
            if f.name not in self._files and all(d in self._files for d in f.dependency):
                self.pool.Add(f)
                self._files.add(f.name)

    def method(self, full_method):
        """(descriptor, request class, response class) of "pkg.Service/Method"."""
        service_name, method_name = full_method.split("/")
        try:
            service = self.pool.FindServiceByName(service_name)
        except KeyError:
            self._load(service_name)
            service = self.pool.FindServiceByName(service_name)
        method = service.methods_by_name[method_name]
        return (method, self.factory.GetPrototype(method.input_type),
                self.factory.GetPrototype(method.output_type))

    def stub(self, full_method):
        method, request, response = self.method(full_method)
        kind = {(False, False): self.channel.unary_unary,
                (False, True): self.channel.unary_stream,
                (True, False): self.channel.stream_unary,
                (True, True): self.channel.stream_stream}[
                    (method.client_streaming, method.server_streaming)]
        return kind("/" + full_method, request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString), request, response

    def call(self, full_method, request_json="{}", timeout=10, metadata=None):
        """Calls a unary method; returns the response as a dict. `metadata`:
        more (key, value) pairs to send with this call."""
        call, request, _ = self.stub(full_method)
        message = json_format.Parse(request_json, request())
        return self.to_dict(call(message, timeout=timeout, metadata=metadata))

    def message(self, type_name, fields=None):
        """A new message of a type the server described."""
        try:
            descriptor = self.pool.FindMessageTypeByName(type_name)
        except KeyError:
            self._load(type_name)
            descriptor = self.pool.FindMessageTypeByName(type_name)
        m = self.factory.GetPrototype(descriptor)()
        if fields:
            json_format.ParseDict(fields, m)
        return m

    @staticmethod
    def to_dict(message):
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         including_default_value_fields=True)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cacert", help="PEM CA the server's certificate must chain to (TLS)")
    parser.add_argument("--cert", help="PEM client certificate (mutual TLS)")
    parser.add_argument("--key", help="PEM private key of --cert")
    parser.add_argument("--token-file", help="file holding the bearer token to send")
    parser.add_argument("target")
    parser.add_argument("command", choices=["list", "call"])
    parser.add_argument("method", nargs="?")
    parser.add_argument("request", nargs="?", default="{}")
    args = parser.parse_args(argv[1:])
    token = _read(args.token_file).decode().strip() if args.token_file else None
    client = ReflectionClient(args.target, args.cacert, args.cert, args.key, token)
    if args.command == "list":
        print("\n".join(client.list_services()))
    else:
        if not args.method:
            parser.error("call needs a method, e.g. ddp.v1.Coordinator/GetStatus")
        print(json.dumps(client.call(args.method, args.request), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
