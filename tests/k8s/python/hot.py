# A Python workload for the cluster test: burns CPU in two named functions, so that the
# profile must name them (tests/k8s/build-images.sh puts it in the python image). Only
# built-in modules: the image holds the interpreter, its libraries and the encodings.
import _signal
import sys


def stop(signum, frame):
    # PID 1 in its container: SIGTERM has no default action there.
    sys.exit(0)


def ember_py_leaf(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x


def ember_py_outer():
    while True:
        ember_py_leaf(20000)


_signal.signal(15, stop)
print("burning", flush=True)
ember_py_outer()
