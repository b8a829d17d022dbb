#!/usr/bin/python3
"""A reflection-driven gRPC client that is given no .proto file, as grpcurl is.

It learns every message type from the server's reflection service, then calls
methods with JSON in and JSON out. Used by the tests to prove that operators
can query the coordinator with nothing but its address:

    grpc_reflect.py 127.0.0.1:29400 list
    grpc_reflect.py 127.0.0.1:29400 call ddp.v1.Coordinator/GetStatus '{}'
    grpc_reflect.py 127.0.0.1:29400 call grpc.health.v1.Health/Check '{}'
"""
import json
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

_REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


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


class ReflectionClient:
    def __init__(self, target):
        # Reconnect quickly: tests restart servers and watch them come back.
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)])
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

    def call(self, full_method, request_json="{}", timeout=10):
        """Calls a unary method; returns the response as a dict."""
        call, request, _ = self.stub(full_method)
        message = json_format.Parse(request_json, request())
        return self.to_dict(call(message, timeout=timeout))

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
    if len(argv) < 3:
        print(__doc__)
        return 2
    client = ReflectionClient(argv[1])
    if argv[2] == "list":
        print("\n".join(client.list_services()))
    elif argv[2] == "call":
        print(json.dumps(client.call(argv[3], argv[4] if len(argv) > 4 else "{}"), indent=2))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
