"""One server over several nodes (--nnodes, --node-rank, --dist-init-addr): the rendezvous of the nodes, the
health server of a node of rank >= 1.

Real SGLang: every TP rank calls torch.distributed.init_process_group(init_method="tcp://<dist_init_addr>") inside
"Init torch distributed begin/ends" (sglang/srt/model_executor/model_runner.py, init_torch_distributed); rank 0 holds
torch's TCPStore there and waits for every rank. The stand-in does it once per node, from the node's first TP rank:
rank 0 listens at the address, each other node connects and names its rank, then rank 0 answers "go". The texts of
the failures are torch's own:
- rank 0, a node never came: torch/csrc/distributed/c10d/TCPStore (server side, wait for workers):
  "Timed out after {timeout + 1} seconds waiting for clients. {joined}/{world} clients joined." (DistStoreError; quoted
  from a real SGLang log in sgl-project/sglang#507, tests/unit/fixtures/sglang_logs/peer_missing_sglang_507.log);
- a node of rank >= 1, rank 0 never answered: torch/csrc/distributed/c10d/socket.cpp SocketConnectOp::throwTimeoutError
  "The client socket has timed out after {timeout}ms while trying to connect to ({host}, {port})." (DistNetworkError);
- a node whose peer went away once serving: NCCL's text for ncclRemoteError (ncclGetErrorString: "remote process
  exited or there was a network error"), raised as SGLang's "RuntimeError: NCCL error: {error_str}"
  (sglang/srt/distributed/device_communicators/pynccl_wrapper.py, NCCL_CHECK). So stopping one node ends the others.
Timeouts run at the stand-in's speed (util.sleep); the default is torch's 1800 s, --dist-timeout sets it.
"""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.srt._kpro_lab import util

_F = "sglang/srt/"
# after scheduler._frames_runner's frames
RENDEZVOUS_FRAMES = [
    (_F + "model_executor/model_runner.py", 490, "initialize", "min_per_gpu_memory = self.init_torch_distributed()"),
    (_F + "model_executor/model_runner.py", 812, "init_torch_distributed", "init_distributed_environment("),
    (_F + "distributed/parallel_state.py", 1684, "init_distributed_environment", "torch.distributed.init_process_group("),
    ("torch/distributed/distributed_c10d.py", 1710, "init_process_group", "store, rank, world_size = next(rendezvous_iterator)"),
]
PEER_LOST = "RuntimeError: NCCL error: remote process exited or there was a network error"


class RendezvousError(Exception):
    def __init__(self, exc_line):
        Exception.__init__(self, exc_line)
        self.exc_line = exc_line


def nnodes(a):
    return max(1, int(getattr(a, "nnodes", 1) or 1))


def local_ranks(a):
    """This node's global ranks (tp_size x pp_size of them over the nodes; rank = pp_rank x tp_size + tp_rank)."""
    n = nnodes(a)
    world = a.tp_size * (getattr(a, "pp_size", 1) or 1)
    per = world // n if world % n == 0 else world
    first = int(getattr(a, "node_rank", 0) or 0) * per if n > 1 else 0
    return list(range(first, first + per))


def timeout_s(a):
    return int(float(getattr(a, "dist_timeout", None) or 1800))


def _addr(a):
    host, _sep, port = (a.dist_init_addr or "127.0.0.1:0").rpartition(":")
    return host.strip("[]"), int(port)


def _wall(seconds):
    return seconds / util.speed()


def rendezvous(a):
    """Called by the node's first TP rank; returns the open connections (kept: their loss ends this node)."""
    host, port = _addr(a)
    if int(getattr(a, "node_rank", 0) or 0) == 0:
        return _serve_store(a, host, port)
    return [_join_store(a, host, port)]


def _serve_store(a, host, port):
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    deadline = time.time() + _wall(timeout_s(a))
    joined, conns = set([0]), []
    try:
        while len(joined) < nnodes(a):
            left = deadline - time.time()
            if left <= 0:
                per = len(local_ranks(a))
                raise RendezvousError("torch.distributed.DistStoreError: Timed out after %d seconds waiting for clients. %d/%d clients joined."
                                      % (timeout_s(a) + 1, len(joined) * per, a.tp_size))
            srv.settimeout(min(left, 0.5))
            try:
                c, _peer = srv.accept()
            except socket.timeout:
                continue
            c.settimeout(5)
            line = c.makefile("r").readline().split()
            if len(line) == 2 and line[0] == "node":
                joined.add(int(line[1]))
                conns.append(c)
            else:
                c.close()
        for c in conns:
            c.sendall(b"go\n")
            c.settimeout(None)
    finally:
        srv.close()
    return conns


def _join_store(a, host, port):
    deadline = time.time() + _wall(timeout_s(a))
    while True:
        try:
            c = socket.create_connection((host, port), timeout=1.0)
            break
        except OSError:
            if time.time() >= deadline:
                raise RendezvousError("torch.distributed.DistNetworkError: The client socket has timed out after %dms while trying to "
                                      "connect to (%s, %d)." % (timeout_s(a) * 1000, host, port))
            time.sleep(0.2)
    c.sendall(b"node %d\n" % int(a.node_rank))
    c.settimeout(max(1.0, deadline - time.time()))
    try:
        ok = c.makefile("r").readline().strip() == "go"
    except OSError:
        ok = False
    if not ok:
        raise RendezvousError("torch.distributed.DistNetworkError: The client socket has timed out after %dms while trying to "
                              "connect to (%s, %d)." % (timeout_s(a) * 1000, host, port))
    c.settimeout(None)
    return c


def watch(conns, on_lost):
    """A daemon thread per connection: when the peer node goes away, on_lost() (the scheduler fails with NCCL's text)."""
    def run(c):
        try:
            while c.recv(64):
                pass
        except OSError:
            pass
        on_lost()
    for c in conns:
        threading.Thread(target=run, args=(c,), daemon=True).start()


class _Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"

    def do_GET(self):   # noqa: N802 - http.server's name
        status = 200 if self.path.split("?")[0] in ("/ping", "/health", "/health_generate") else 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):     # uvicorn runs it with log_level="warning": no access lines
        pass


def serve_health(host, port):
    """A node of rank >= 1 once its schedulers are ready: real 0.5.11 launch_dummy_health_check_server
    (sglang/srt/utils/common.py:2524-2570: /ping, /health, /health_generate answer 200; uvicorn at log level warning)."""
    class _S(ThreadingHTTPServer):
        allow_reuse_address = True
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    httpd = _S((host, port), _Health)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    return httpd
