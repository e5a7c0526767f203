"""A minimal OTLP/gRPC metrics receiver for ember's tests, built on the official protos
(PyPI opentelemetry-proto) and grpcio.

Usage: receiver.py PORT OUT_FILE
Every Export request is appended to OUT_FILE as one JSON line (protobuf's canonical JSON
mapping) with the request's gRPC metadata under "metadata". Prints "listening" once ready.
"""
import json
import sys
from concurrent import futures

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc


class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, out):
        self.out = out

    def Export(self, request, context):
        line = {
            "metadata": {k: v for k, v in context.invocation_metadata()},
            "request": json_format.MessageToDict(request),
        }
        with open(self.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main():
    port, out = sys.argv[1], sys.argv[2]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(out), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("listening", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
