"""The main process: argument parsing, subprocess launch, uvicorn-like HTTP server, warmup."""

import json
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.srt._kpro_lab import args as sargs
from sglang.srt._kpro_lab import generate, gpustate, metrics, multinode, reasoning, scheduler, util
from sglang.version import __version__

STARTING, UP, UNHEALTHY = "Starting", "Up", "UnHealthy"
_PNG_32 = ("iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAKElEQVR4nO3NMQEAAAjDMMC/52ECvlRA01vZJvwHAAAAAAAAAAAAbx2jxAE/i2AjOgAAAABJRU5ErkJggg==")


_VERSION = sargs.version_tuple()


class SchedulerDied(RuntimeError):
    """0.5.10+ ``_scheduler_died_error`` (0.5.11 sglang/srt/entrypoints/engine.py:1216-1224), raised out of
    ``_wait_for_scheduler_ready`` (1227-1256); the text is the source's f-strings with the rank and exit code filled in."""

    def __init__(self, rank, proc, line):
        proc.join(10)
        RuntimeError.__init__(self, "Rank %d scheduler died during initialization (exit code: %s). If exit code is -9 (SIGKILL), a common "
                                    "cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check." % (rank, proc.exitcode))
        self.frames = [
            ("sglang/launch_server.py", 69, "<module>", "run_server(server_args)"),
            ("sglang/launch_server.py", 50, "run_server", "launch_server(server_args)"),
            ("sglang/srt/entrypoints/http_server.py", 2344, "launch_server", ") = Engine._launch_subprocesses("),
            ("sglang/srt/entrypoints/engine.py", 762, "_launch_subprocesses", "scheduler_init_result.wait_for_ready()"),
            ("sglang/srt/entrypoints/engine.py", 619, "wait_for_ready", "infos = _wait_for_scheduler_ready(scheduler_pipe_readers, scheduler_procs)"),
            ("sglang/srt/entrypoints/engine.py", line, "_wait_for_scheduler_ready", "raise _scheduler_died_error(%s, scheduler_procs[%s])"
             % (("i", "i") if line == 1243 else ("j", "j"))),
        ]


class Main(object):
    def __init__(self, server_args, facts, drills):
        self.a = server_args
        self.facts = facts
        self.drills = drills
        self.status = STARTING
        self.phase = "loading"
        self.procs = {}          # rank -> mp.Process
        self.conns = {}
        self.detok = None
        self.rank_info = {}
        self.httpd = None
        self.gracefully_exit = False
        self.created = int(time.time())
        self.lock = threading.Lock()
        self.degenerate = self._degenerate_mode()
        # 0.5.11 TemplateManager.force_reasoning, from the model's chat template at startup (reasoning.py)
        self.template_force = reasoning.template_forces_reasoning(server_args.model_path, getattr(server_args, "chat_template", None))
        self.first_request_done = False
        self.requests_total = 0
        # GET /metrics (--enable-metrics): rank 0's KV pool and request slots once it has started
        self.metrics = metrics.Metrics(server_args.served_model_name, lambda: (
            self.rank_info.get(0, {}).get("max_total_num_tokens"), self.rank_info.get(0, {}).get("max_running_requests")),
            speculative=bool(server_args.speculative_algorithm))
        self.killing = False
        self.forwards = set()   # "forward" once a request reached the ranks, "sample" once a sampled one did
        self.forward_lock = threading.Lock()

    def first_forwards(self, greedy):
        """Until the ranks have run a request and a sampled one, hand each request to them first: its forwards and
        sampling are where the real libraries compile (toolchain.py); a failure there ends the server by SIGQUIT."""
        if "forward" in self.forwards and (greedy or "sample" in self.forwards):
            return
        with self.forward_lock:
            for c in self.conns.values():
                c.send(("forward", greedy))
            for c in self.conns.values():
                try:
                    c.recv()
                except (EOFError, OSError):
                    while True:
                        time.sleep(3600)   # the rank failed: its SIGQUIT ends this process
            self.forwards.update(("forward",) if greedy else ("forward", "sample"))

    def _degenerate_mode(self):
        if "degenerate_output" in self.drills:
            return "newlines"
        if "degenerate_loop" in self.drills:
            return "loop"
        if os.environ.get("KPRO_LAB_SGLANG_NATURAL_BUGS", "1") == "0":
            return None
        dense_qwen35 = self.facts.arch in ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM")
        v = sargs.version_tuple()
        if dense_qwen35 and self.a.tp_size > 1 and v < (0, 5, 10, 0):
            return "newlines"       # sglang PR #19070 (MLP never all-reduced at TP>1), fixed after 0.5.9
        if dense_qwen35 and (0, 5, 10, 0) <= v < (0, 5, 11, 0):
            return "loop"           # sglang PR #22312 (GDN non-contiguous a/b), fixed in 0.5.11
        return None

    # ---- process tree -------------------------------------------------------------
    def leftover_pids(self):
        if "leftover_child" not in self.drills:
            return set()
        p = self.procs.get(self.a.tp_size - 1)
        return {p.pid} if p is not None and p.pid else set()

    def kill_process_tree(self, include_parent):
        skip = self.leftover_pids()
        kids = [k for k in util.children_of(os.getpid()) if k not in skip]
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for p in list(self.procs.values()) + ([self.detok] if self.detok else []):
            if p.pid in skip:
                continue
            try:
                p.join(5)
            except Exception:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
        try:
            gpustate.release(kids)
        except Exception:
            pass
        if include_parent:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(5)

    def on_sigquit(self, signum, frame):
        if self.killing:
            return
        self.killing = True

        def go():
            util.log("Received sigquit from a child process. It usually means the child failed.", level=40)
            self.kill_process_tree(include_parent=True)
        gpustate.run_unlocked(go)

    def on_sigterm(self, signum, frame):
        def go():
            if self.phase == "loading":
                self.kill_process_tree(include_parent=False)
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                time.sleep(5)
                os._exit(128 + signum)
            if self.first_request_done:
                self.gracefully_exit = True
                util.log("Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].")
                self.kill_process_tree(include_parent=True)
            util.uvlog("Shutting down")
            util.uvlog("Waiting for application shutdown.")
            util.uvlog("Application shutdown complete.")
            util.uvlog("Finished server process [%d]" % os.getpid())
            self.kill_process_tree(include_parent=False)
            os._exit(0)
        gpustate.run_unlocked(go)

    # ---- startup -----------------------------------------------------------------
    def spawn(self):
        ctx = multiprocessing.get_context("spawn")
        state = gpustate.load_or_empty()
        devices = _visible(state)
        a = self.a
        for i, r in enumerate(multinode.local_ranks(a)):     # this node's TP ranks (all of them on a single node)
            cuda_index = a.base_gpu_id + i * a.gpu_id_step
            gpu_index = devices[cuda_index][0] if cuda_index < len(devices) else None
            if not devices:
                cuda_index = None
            parent, child = ctx.Pipe()
            p = ctx.Process(target=scheduler.run_scheduler_process,
                            args=(r, child, a, self.facts, gpu_index, cuda_index, self.drills, os.getpid()))
            p.start()
            child.close()
            self.procs[r] = p
            self.conns[r] = parent
        self.detok = ctx.Process(target=scheduler.run_detokenizer_process, args=(os.getpid(),))
        self.detok.start()

    def wait_ready(self):
        """Serve the ranks' all-reduces until every rank reports ready."""
        rounds = {}
        ready = {}
        conn_rank = dict((c, r) for r, c in self.conns.items())
        while len(ready) < len(self.procs):
            objs = [c for r, c in self.conns.items() if r not in ready]
            got = multiprocessing.connection.wait(objs, timeout=1.0)
            if not got:
                # 0.5.10+ polls and checks every rank for an early death (engine.py:1247-1254)
                for r in sorted(self.procs):
                    if _VERSION >= (0, 5, 10, 0) and not self.procs[r].is_alive():
                        raise SchedulerDied(r, self.procs[r], 1254)
            for c in got:
                r = conn_rank[c]
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    if _VERSION >= (0, 5, 10, 0):
                        raise SchedulerDied(r, self.procs[r], 1243)
                    self.procs[r].join(2)
                    util.log("Rank %d scheduler is dead. Please check if there are relevant logs." % r, level=40)
                    util.log("Exit code: %s" % self.procs[r].exitcode, level=40)
                    raise EOFError()
                tag = msg[0]
                if tag == "ready":
                    ready[r] = msg[2]
                    continue
                vals = rounds.setdefault(tag, {})
                vals[r] = msg[2]
                if len(vals) == len(self.procs):
                    m = min(vals.values())
                    for rr in vals:
                        self.conns[rr].send(("min", m))
                    del rounds[tag]
        self.rank_info = ready
        if any(v.get("status") != "ready" for v in ready.values()):
            raise RuntimeError("Initialization failed. Please see the error messages above.")

    def run(self):
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGINT, self.on_sigterm)
        util.log(self.a.log_text())
        self.spawn()
        try:
            self.wait_ready()
        except SchedulerDied as e:
            # raised out of launch_server; its finally (launch_server.py:69-71) ends the children, then the traceback, exit 1
            self.kill_process_tree(include_parent=False)
            sys.stderr.write(util.fake_traceback(e.frames, "RuntimeError: %s" % e))
            sys.stderr.flush()
            os._exit(1)
        except EOFError:
            traceback.print_exc()
            self.kill_process_tree(include_parent=False)
            os._exit(1)
        util.sleep(0.1)
        if multinode.nnodes(self.a) > 1 and self.a.node_rank >= 1:
            # real 0.5.11 engine.py:712-737: a node of rank >= 1 runs no tokenizer or HTTP server, only a health server
            multinode.serve_health(self.a.host, self.a.port)
            self.phase = "serving"
            self.watch_children()
        self.serve_http()

    def serve_http(self):
        a = self.a
        util.uvlog("Started server process [%d]" % os.getpid())
        util.uvlog("Waiting for application startup.")
        util.uvlog("Application startup complete.")
        err = None
        if "port_in_use" in self.drills:
            err = "[Errno 98] error while attempting to bind on address ('%s', %d): address already in use" % (a.host, a.port)
        else:
            try:
                self.httpd = _Server(self, (a.host, a.port))
            except OSError as e:
                err = "[Errno %d] error while attempting to bind on address ('%s', %d): %s" % (
                    e.errno or 0, a.host, a.port, (e.strerror or str(e)).lower())
        if err:
            util.uvlog(err, "ERROR")
            util.uvlog("Waiting for application shutdown.")
            util.uvlog("Application shutdown complete.")
            self.kill_process_tree(include_parent=False)
            os._exit(3)
        self.phase = "serving"
        host = "[%s]" % a.host if ":" in a.host else a.host
        util.uvlog("Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (host, a.port))
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        threading.Thread(target=self.warmup, daemon=True).start()
        self.watch_children()

    def base_url(self):
        host = self.a.host
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1" if host != "::" else "::1"
        return "http://%s:%d" % ("[%s]" % host if ":" in host else host, self.a.port)

    def warmup(self):
        a = self.a
        headers = {"Content-Type": "application/json"}
        if a.api_key:
            headers["Authorization"] = "Bearer " + a.api_key
        try:
            for _try in range(120):
                util.sleep(1.0)
                try:
                    with urllib.request.urlopen(urllib.request.Request(self.base_url() + "/model_info", headers=headers), timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    continue
            if a.skip_server_warmup:
                self.status = UP
            else:
                if self.facts.is_multimodal:
                    path = "/v1/chat/completions"
                    body = {"model": a.served_model_name, "messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _PNG_32}},
                        {"type": "text", "text": "Describe the image."}]}], "max_tokens": 8, "temperature": 0}
                else:
                    path = "/generate"
                    body = {"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
                req = urllib.request.Request(self.base_url() + path, data=json.dumps(body).encode(), headers=headers, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=600) as r:
                        status, text = r.status, r.read().decode()
                except urllib.error.HTTPError as e:
                    status, text = e.code, e.read().decode()
                if status != 200:
                    raise AssertionError(text)
                for c in self.conns.values():
                    try:
                        c.send(("warmup",))
                    except OSError:
                        pass
                self.status = UP
        except Exception:
            tb = traceback.format_exc().replace(os.path.abspath(__file__), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                                                        "entrypoints", "http_server.py"))
            util.log("Initialization failed. warmup error: %s" % tb, level=40)
            self.kill_process_tree(include_parent=True)
            return
        util.log("The server is fired up and ready to roll!")

    def watch_children(self):
        """The main thread from here on: notice children that die (their GPU memory is freed)."""
        alive = dict((p.sentinel, (r, p)) for r, p in self.procs.items())
        if self.detok is not None:
            alive[self.detok.sentinel] = ("detokenizer", self.detok)
        while alive:
            for s in multiprocessing.connection.wait(list(alive), timeout=1.0):
                r, p = alive.pop(s)
                p.join(1)
                util.log("Child process unexpectedly failed with exitcode=%s. pid=%s" % (p.exitcode, p.pid), level=30)
                gpustate.run_unlocked(lambda pid=p.pid: gpustate.release([pid]))
                self.status = UNHEALTHY
        while True:
            time.sleep(3600)


def _usable_gpus(state):
    """The GPUs CUDA can see: with the nvidia module loaded and the device bound to it, like
    nvml_render.bound_gpus (a state without "modules"/"pci" sections, as in unit tests, has all)."""
    if "modules" in state and "nvidia" not in (state.get("modules") or {}).get("loaded", []):
        return _IndexedList([], [])
    devs = (state.get("pci") or {}).get("devices") if "pci" in state else None
    out = []
    for g in state.get("gpus", []):
        if devs is not None and (devs.get(g.get("bdf")) or {}).get("driver") != "nvidia":
            continue
        out.append(g)
    # keep the state index: visible_gpus() indexes into this list, map back
    return _IndexedList(out, [state["gpus"].index(g) for g in out])


class _IndexedList(list):
    def __init__(self, items, indices):
        super().__init__(items)
        self.indices = indices


def _visible(state):
    usable = _usable_gpus(state)
    pairs = sargs.visible_gpus(list(usable))
    return [(usable.indices[i], g) for i, g in pairs]


# ---- generation -------------------------------------------------------------------

_TOK = re.compile(r"\w+|[^\w\s]|\n")


def count_tokens(text):
    return len(_TOK.findall(text or ""))


def truncate(text, max_tokens):
    if max_tokens is None:
        return text, False
    n = 0
    for m in _TOK.finditer(text):
        n += 1
        if n > max_tokens:
            return text[:m.start()].rstrip(" "), True
    return text, False


def answer(prompt, completion=False):
    return generate.answer(prompt, completion)


def degenerate(mode, max_tokens):
    if mode == "newlines":
        return "\n\n" * 4, False
    text = "Okay, let me think about this. " * 200
    return truncate(text, max_tokens or 256)[0], True


def _message_text(content):
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")
    return content or ""


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, main, addr):
        self.main = main
        host = addr[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    def log_request(self, code="-", size="-"):
        try:
            code = int(code)
        except (TypeError, ValueError):
            return
        phrase = self.responses.get(code, ("",))[0]
        util.access(self.client_address[:2], self.requestline, code, phrase)

    @property
    def m(self):
        return self.server.main

    def _send(self, code, body=None, ctype="application/json", extra=None):
        if body is None:
            data = b""
        elif isinstance(body, (bytes, str)):
            data = body.encode() if isinstance(body, str) else body
        else:
            data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _auth_ok(self):
        key = self.m.a.api_key
        path = self.path.split("?", 1)[0]
        if not key or path.startswith("/health") or path.startswith("/metrics"):
            return True
        if self.headers.get("Authorization", "") == "Bearer " + key:
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):
        if not self._auth_ok():
            return
        path = self.path.split("?", 1)[0]
        m = self.m
        a = m.a
        if path in ("/health", "/health_generate"):
            ok = m.status == UP and not m.gracefully_exit
            return self._send(200 if ok else 503, None)
        if path == "/ping":
            return self._send(200, None)
        if path in ("/model_info", "/get_model_info"):
            if path == "/get_model_info":
                util.log("Endpoint '/get_model_info' is deprecated and will be removed in a future version. Please use '/model_info' instead.", level=30)
            return self._send(200, {
                "model_path": a.model_path, "tokenizer_path": a.tokenizer_path, "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default", "has_image_understanding": m.facts.is_multimodal, "has_audio_understanding": False,
                "model_type": m.facts.model_type, "architectures": m.facts.architectures})
        if path in ("/server_info", "/get_server_info"):
            info = dict(a.asdict())
            r0 = m.rank_info.get(0, {})
            info.update({"status": "ready", "max_total_num_tokens": r0.get("max_total_num_tokens"), "max_req_input_len": r0.get("max_req_input_len")})
            state = dict(a.asdict())
            state.update({"last_gen_throughput": 0.0, "memory_usage": r0.get("memory_usage"),
                          "effective_max_running_requests_per_dp": r0.get("max_running_requests")})
            info["internal_states"] = [state]
            info["version"] = __version__
            return self._send(200, info)
        if path == "/v1/models":
            return self._send(200, {"object": "list", "data": [self._card()]})
        if path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name != a.served_model_name:
                return self._send(404, {"error": {"message": "The model '%s' does not exist" % name, "type": "invalid_request_error",
                                                  "param": "model", "code": "model_not_found"}})
            return self._send(200, self._card())
        if path == "/metrics" or path.startswith("/metrics/"):
            # mounted only with --enable-metrics (0.5.11 entrypoints/http_server.py:303-305); else FastAPI's 404
            if not a.enable_metrics:
                return self._send(404, {"detail": "Not Found"})
            return self._send(200, m.metrics.render(1.05 if m.degenerate else 3.12), ctype="text/plain; version=0.0.4; charset=utf-8")
        if path in ("/get_load", "/v1/loads"):
            return self._send(200, [{"num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "dp_rank": 0}])
        if path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            return self._send(405, {"detail": "Method Not Allowed"})
        return self._send(404, {"detail": "Not Found"})

    def _card(self):
        a = self.m.a
        return {"id": a.served_model_name, "object": "model", "created": self.m.created, "owned_by": "sglang",
                "root": a.served_model_name, "parent": None, "max_model_len": a.context_length}

    def do_PUT(self):
        return self.do_POST()

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self._auth_ok():
            return
        if path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
            if path in ("/health", "/v1/models", "/model_info", "/server_info"):
                return self._send(405, {"detail": "Method Not Allowed"})
            return self._send(404, {"detail": "Not Found"})
        try:
            body = json.loads(raw.decode() or "{}")
        except ValueError as e:
            return self._send(400, {"object": "error", "message": "JSON decode error: %s" % e, "type": "BadRequestError", "param": None, "code": 400})
        m = self.m
        if m.status == UNHEALTHY:
            return self._send(503, {"object": "error", "message": "The server is not healthy.", "type": "ServiceUnavailableError", "param": None, "code": 503})
        if "warmup_failed" in m.drills and m.status == STARTING:
            return self._send(500, {"object": "error", "message": "Internal server error: CUDA error: an illegal memory access was encountered",
                                    "type": "InternalServerError", "param": None, "code": 500})
        m.requests_total += 1
        m.first_forwards(_greedy(path, body))
        if path == "/generate":
            return self._generate(body)
        return self._openai(path, body)

    def _produce(self, prompt, max_tokens, completion, think=False, extra=0):
        """(generated text, prompt tokens, completion tokens, hit max_tokens); ``think``: a thinking model's chat answer
        (the thinking, ``</think>``, the answer: reasoning.generated), max_tokens counting the thinking too; ``extra``:
        the earlier messages' prompt tokens."""
        m = self.m
        t0 = time.time()
        prompt_tokens = count_tokens(prompt) + (0 if completion else 9)
        if prompt_tokens >= (m.rank_info.get(0, {}).get("max_req_input_len") or 1 << 30):
            return None
        modes = self.modes = generate.live_modes(m.a.tp_size)
        if m.degenerate:
            text, hit_len = degenerate(m.degenerate, max_tokens)
        else:
            text = generate.spoil(generate.answer(prompt, completion, wrong="wrong_answer_tp" in modes), modes)
            text, hit_len = truncate(reasoning.generated(prompt, text) if think else text, max_tokens)
        ctoks = count_tokens(text) or 1
        prefix = " TP0"
        hybrid = m.facts.hybrid
        util.log("Prefill batch, #new-seq: 1, #new-token: %d, #cached-token: 0, full token usage: 0.00, %s#running-req: 0, #queue-req: 0, "
                 "input throughput (token/s): %.2f, cuda graph: False" % (prompt_tokens, "mamba usage: 0.00, " if hybrid else "", prompt_tokens * 25.0),
                 prefix)
        rid = uuid.uuid4().hex
        m.metrics.prefill(rid, prompt_tokens + extra)
        util.sleep(0.02)        # the prefill, up to the first token
        ttft = time.time() - t0
        util.sleep(0.004 * ctoks)
        if ctoks >= 40:
            m.metrics.decode(rid, prompt_tokens + extra + ctoks, ctoks / max(time.time() - t0 - ttft, 1e-3))
            spec = ("accept len: %.2f, accept rate: %.2f, " % ((1.05, 0.26) if m.degenerate else (3.12, 0.78))) if m.a.speculative_algorithm else ""
            util.log("Decode batch, #running-req: 1, #full token: %d, full token usage: 0.00, %s%scuda graph: True, gen throughput (token/s): 41.87, "
                     "#queue-req: 0" % (prompt_tokens + ctoks, "mamba num: 1, mamba usage: 0.01, " if hybrid else "", spec), prefix)
        m.first_request_done = True
        m.metrics.finish(rid, prompt_tokens + extra, ctoks, ttft, time.time() - t0)
        return text, prompt_tokens + extra, ctoks, hit_len

    def _spec_meta(self, ctoks):
        if not self.m.a.speculative_algorithm:
            return {}
        acc = 1.05 if self.m.degenerate else 3.12
        verify = max(1, int(round(ctoks / acc)))
        return {"spec_accept_rate": round((acc - 1) / max(1, (self.m.a.speculative_num_draft_tokens or 4) - 1), 3),
                "spec_accept_length": acc, "spec_accept_token_num": max(0, ctoks - verify),
                "spec_draft_token_num": verify * ((self.m.a.speculative_num_draft_tokens or 4) - 1), "spec_verify_ct": verify}

    def _too_long(self):
        mx = self.m.rank_info.get(0, {}).get("max_req_input_len")
        return self._send(400, {"error": {"message": "The input is longer than the model's context length or memory pool (%s tokens)." % mx}})

    def _generate(self, body):
        texts = body.get("text")
        sp = body.get("sampling_params") or {}
        max_new = sp.get("max_new_tokens", 128)
        single = not isinstance(texts, list)
        outs = []
        t0 = time.time()
        for t in ([texts] if single else texts):
            r = self._produce(t if isinstance(t, str) else "", max_new, True)
            if r is None:
                return self._too_long()
            text, pt, ct, hit_len = r
            meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": ct} if hit_len else {"type": "stop", "matched": 248046},
                    "prompt_tokens": pt, "weight_version": "default", "completion_tokens": ct, "cached_tokens": 0,
                    "e2e_latency": round(time.time() - t0, 4)}
            meta.update(self._spec_meta(ct))
            outs.append({"text": text, "meta_info": meta})
        return self._send(200, outs[0] if single else outs)

    def _openai(self, path, body):
        chat = path.endswith("chat/completions")
        model = body.get("model") or self.m.a.served_model_name
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if chat:
            msgs = body.get("messages") or []
            users = [_message_text(x.get("content")) for x in msgs if isinstance(x, dict) and x.get("role") == "user"]
            prompt = users[-1] if users else ""
            extra = sum(count_tokens(_message_text(x.get("content"))) + 4 for x in msgs[:-1] if isinstance(x, dict))
        else:
            prompt = body.get("prompt") or ""
            if isinstance(prompt, list):
                prompt = prompt[0] if prompt else ""
            extra = 0
        # a thinking model thinks unless the chat template is told not to (reasoning.py: Qwen3.6's template)
        think = chat and reasoning.thinks(self.m.facts.arch) and reasoning.thinking_on(reasoning.template_kwargs(body))
        r = self._produce(prompt, max_tokens, not chat, think=think, extra=extra)
        if r is None:
            return self._too_long()
        text, pt, ct, hit_len = r
        finish = "length" if hit_len else "stop"
        wrong = "wrong_answer_tp" in self.modes
        logprobs = None
        if body.get("logprobs") and not body.get("stream"):
            logprobs = generate.logprobs(text, chat, wrong)
        thought = None
        if chat:
            # --reasoning-parser splits the generated text (0.5.11 serving_chat.py:1059-1105); without it all is content
            text, thought = reasoning.separate(text, self.m.a.reasoning_parser, body, self.m.template_force)
        if chat and "reasoning_only" in self.modes:
            text, thought = None, "\n\n".join(t for t in (thought, text) if t) or None
        rid = uuid.uuid4().hex
        usage = {"prompt_tokens": pt, "total_tokens": pt + ct, "completion_tokens": ct, "prompt_tokens_details": None, "reasoning_tokens": 0}
        now = int(time.time())
        if body.get("stream"):
            obj = "chat.completion.chunk" if chat else "text_completion"
            chunks = []
            if chat:
                if thought:
                    chunks.append({"id": rid, "object": obj, "created": now, "model": model,
                                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "reasoning_content": thought},
                                                "logprobs": None, "finish_reason": None}]})
                chunks.append({"id": rid, "object": obj, "created": now, "model": model,
                               "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": None}]})
                chunks.append({"id": rid, "object": obj, "created": now, "model": model,
                               "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}], "usage": usage})
            else:
                chunks.append({"id": rid, "object": obj, "created": now, "model": model,
                               "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], "usage": usage})
            data = "".join("data: %s\n\n" % json.dumps(c) for c in chunks) + "data: [DONE]\n\n"
            return self._send(200, data, ctype="text/event-stream; charset=utf-8")
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": thought, "tool_calls": None},
                      "logprobs": logprobs, "finish_reason": finish, "matched_stop": None if hit_len else 248046}
            out = {"id": rid, "object": "chat.completion", "created": now, "model": model, "choices": [choice], "usage": usage,
                   "metadata": {"weight_version": "default"}}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, "matched_stop": None if hit_len else 248046}
            out = {"id": rid, "object": "text_completion", "created": now, "model": model, "choices": [choice], "usage": usage,
                   "metadata": {"weight_version": "default"}}
        return self._send(200, out)


def _greedy(path, body):
    """sampling_info.is_all_greedy (sampler.py:111): top_k <= 1, which temperature 0 implies (sampling_params.py);
    the OpenAI endpoints' temperature defaults to 1.0."""
    sp = (body.get("sampling_params") or {}) if path == "/generate" else body
    if not isinstance(sp, dict):
        return False
    try:
        temp, top_k = float(sp.get("temperature", 1.0)), int(sp.get("top_k", -1))
    except (TypeError, ValueError):
        return False
    return 0 <= temp < 1e-6 or 0 < top_k <= 1


def launch(argv):
    drills, unknown = util.read_drills()
    if unknown:
        sys.stderr.write("kpro-lab sglang stand-in: unknown drill(s) %s (known: %s)\n" % (", ".join(unknown), ", ".join(util.KNOWN_DRILLS)))
        sys.exit(70)
    try:
        a, facts = sargs.prepare(argv)
    except sargs.StartupRefusal as e:
        # uncaught in the real launch_server.py:66 (before the try at 68): the interpreter prints it, exit 1
        sys.stdout.flush()
        sys.stderr.write(util.fake_traceback(e.frames, "ValueError: %s" % e))
        sys.stderr.flush()
        sys.exit(1)
    m = Main(a, facts, drills)
    try:
        m.run()
    finally:
        # real 0.5.11 sglang/launch_server.py:69-71: an exception out of the server (e.g. uvicorn's bind with a
        # port > 65535: "OverflowError: bind(): port must be 0-65535.") ends the children, then the process (exit 1)
        m.kill_process_tree(include_parent=False)
