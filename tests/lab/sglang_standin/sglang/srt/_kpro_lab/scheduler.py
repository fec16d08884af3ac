"""A TP rank's scheduler process (``sglang::scheduler_TP<r>``) and the detokenizer.

Each rank walks ModelRunner's startup (sglang-0.5.9 model_executor/model_runner.py: init_torch_distributed,
load_model, init_memory_pool, init_device_graphs), puts its memory on its GPU in the lab state as it goes, and
reports to the main process over a pipe (which also carries the min-all-reduces SGLang does across ranks).
"""

import os
import signal
import sys
import time

from sglang.srt._kpro_lab import gpustate, memory, multinode, toolchain, util
from sglang.srt._kpro_lab.memory import GIB, MIB

_F = "sglang/srt/"

# 0.5.11 model_executor/cuda_graph_runner.py:1431-1438 CUDA_GRAPH_CAPTURE_FAILED_MSG (after "Capture cuda graph failed: {e}\n", 717)
_CAPTURE_FAILED_MSG = ("Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                       "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n3. disable torch compile by not using --enable-torch-compile\n"
                       "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
                       "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ")


_SET_DEVICE = (_F + "model_executor/model_runner.py", 760, "init_torch_distributed", "torch.get_device_module(self.device).set_device(self.gpu_id)")


def _fmt_size(nbytes):
    if nbytes < GIB:
        return "%.2f MiB" % (nbytes / MIB)
    return "%.2f GiB" % (nbytes / GIB)


def _frames_runner(extra):
    return [
        (_F + "managers/scheduler.py", 3175, "run_scheduler_process", "scheduler = Scheduler("),
        (_F + "managers/scheduler.py", 368, "__init__", "self.init_model_worker()"),
        (_F + "managers/scheduler.py", 543, "init_model_worker", "self.init_tp_model_worker()"),
        (_F + "managers/scheduler.py", 505, "init_tp_model_worker", "self.tp_worker = TpModelWorker(**worker_kwargs)"),
        (_F + "managers/tp_worker.py", 247, "__init__", "self._init_model_runner()"),
        (_F + "managers/tp_worker.py", 330, "_init_model_runner", "self._model_runner = ModelRunner("),
        (_F + "model_executor/model_runner.py", 371, "__init__", "self.initialize(min_per_gpu_memory)"),
    ] + extra


class Rank(object):
    def __init__(self, rank, conn, server_args, facts, gpu_index, cuda_index, drills, ppid):
        self.rank = rank
        self.conn = conn
        self.a = server_args
        self.facts = facts
        self.gpu = gpu_index
        self.cuda_index = cuda_index
        self.drills = drills
        self.ppid = ppid
        self.stage = rank // server_args.tp_size     # the pipeline stage (rank = pp_rank x tp_size + tp_rank)
        # 0.5.11 run_scheduler_process (managers/scheduler.py:3845-3860): " PP<n>" with pp_size > 1, then " TP<n>"
        self.prefix = " TP%d" % rank if server_args.pp_size <= 1 else " PP%d" % self.stage + (
            " TP%d" % (rank % server_args.tp_size) if server_args.tp_size > 1 else "")
        self.title = "sglang::scheduler" + self.prefix.replace(" ", "_")
        self.ident = gpustate.identity()
        self.used = 0.0  # bytes on our GPU
        self.torch_alloc = 0.0
        self.leftover = "leftover_child" in drills and rank == server_args.tp_size - 1
        self.toolchain = toolchain.Toolchain(server_args, facts)

    # -- helpers --
    def log(self, msg, level=20):
        util.log(msg, self.prefix, level)

    def alloc(self, nbytes, torch_tensor=True):
        """Grow our usage by nbytes; raise a torch-style OOM when the GPU is full."""
        new = self.used + nbytes
        try:
            gpustate.set_usage(self.gpu, new / MIB, self.title, self.ident)
        except gpustate.OutOfMemory as e:
            procs = "".join("Process %s has %s memory in use. " % (pid, _fmt_size(mib * MIB)) for pid, mib in e.processes)
            text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is free. "
                    "%sIncluding non-PyTorch memory, this process has %s memory in use. Of the allocated memory %s is allocated by PyTorch, "
                    "and %s is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  "
                    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
                    % (_fmt_size(nbytes), self.cuda_index, _fmt_size(e.total_mib * MIB), _fmt_size(max(e.free_mib, 0) * MIB), procs,
                       _fmt_size(self.used), _fmt_size(self.torch_alloc), _fmt_size(20 * MIB)))
            raise MemoryError(text)
        self.used = new
        if torch_tensor:
            self.torch_alloc += nbytes

    def free_gib(self):
        return gpustate.free_mib(self.gpu) / 1024.0

    def allreduce_min(self, tag, value):
        self.conn.send((tag, self.rank, value))
        msg = self.conn.recv()
        return msg[1]

    def fail(self, frames, exc_line, quit_delay=0.0):
        tb = util.fake_traceback(frames, exc_line)
        self.log("Scheduler hit an exception: %s" % tb, level=40)
        util.sleep(quit_delay)
        try:
            os.kill(self.ppid, signal.SIGQUIT)
        except OSError:
            pass
        while True:
            time.sleep(3600)

    def fail_text(self, text):
        """fail() with a whole traceback text (chained exceptions), as traceback.format_exc() renders it."""
        self.fail([], text.replace("Traceback (most recent call last):\n", "", 1).rstrip("\n"))

    def first_request(self, greedy):
        """A request's first forwards and sampling (toolchain.py): the compiles they need, in this scheduler process."""
        try:
            self.toolchain.request(greedy)
        except toolchain.FirstForwardError as e:
            self.fail_text(toolchain.render(toolchain.REQUEST_OUTER, e))

    def join_nodes(self):
        """A multi-node server: this node's first rank meets the other nodes at --dist-init-addr (multinode.py)."""
        try:
            peers = multinode.rendezvous(self.a)
        except multinode.RendezvousError as e:
            self.fail(_frames_runner(multinode.RENDEZVOUS_FRAMES), e.exc_line)
        multinode.watch(peers, lambda: self.fail(_frames_runner([
            (_F + "distributed/device_communicators/pynccl_wrapper.py", 376, "NCCL_CHECK", 'raise RuntimeError(f"NCCL error: {error_str}")'),
        ]), multinode.PEER_LOST))

    def hang(self):
        while True:
            time.sleep(3600)

    # -- phases --
    def run(self):
        a, facts = self.a, self.facts
        if "init_failed_before_gpu" in self.drills:
            util.sleep(0.3)
            self.fail(*_init_failed_traceback(a, facts), quit_delay=2.0)
        t0 = time.time()
        self.log(_line("dist_begin"))
        util.sleep(0.1)
        if multinode.nnodes(a) > 1 and self.rank == multinode.local_ranks(a)[0]:
            self.join_nodes()
        if self.gpu is None:
            msg = "RuntimeError: No CUDA GPUs are available" if self.cuda_index is None else (
                "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported at some other API call, "
                "so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
            self.fail(_frames_runner([_SET_DEVICE]),
                      msg.rstrip("\n"))
        before = self.free_gib()
        try:
            self.alloc(memory.context_mib(a.tp_size) * MIB, torch_tensor=False)
        except MemoryError:
            self.fail(_frames_runner([_SET_DEVICE]),
                      "RuntimeError: CUDA error: out of memory")
        if self.drills.get("hang") == "nccl":
            self.hang()
        util.sleep(0.2)
        if "nccl_error" in self.drills:
            util.sleep(2.0)  # NCCL gives up after its bootstrap retries
            self.fail(_frames_runner([
                (_F + "model_executor/model_runner.py", 490, "initialize", "min_per_gpu_memory = self.init_torch_distributed()"),
                (_F + "model_executor/model_runner.py", 826, "init_torch_distributed", "initialize_model_parallel("),
                (_F + "distributed/parallel_state.py", 1609, "initialize_model_parallel", "_TP = init_model_parallel_group("),
                (_F + "distributed/parallel_state.py", 1390, "init_model_parallel_group", "return GroupCoordinator("),
                (_F + "distributed/parallel_state.py", 303, "__init__", "self.pynccl_comm = PyNcclCommunicator("),
                (_F + "distributed/device_communicators/pynccl.py", 110, "__init__", "self.comm: ncclComm_t = self.nccl.ncclCommInitRank("),
                (_F + "distributed/device_communicators/pynccl_wrapper.py", 420, "ncclCommInitRank", "self.NCCL_CHECK("),
                (_F + "distributed/device_communicators/pynccl_wrapper.py", 376, "NCCL_CHECK", 'raise RuntimeError(f"NCCL error: {error_str}")'),
            ]), "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)")
        if a.tp_size > 1:
            self.alloc(memory.NCCL_INIT_MIB * MIB, torch_tensor=False)
        local = self.free_gib()
        total_gpu = self.allreduce_min("dist", local)
        if a.tp_size > 1 and total_gpu < local * 0.9:
            self.log("The memory capacity is unbalanced. Some GPUs may be occupied by other processes. min_per_gpu_memory=%s, "
                     "local_gpu_memory=%s, local_gpu_memory * 0.9=%s" % (total_gpu, local, local * 0.9), level=30)
        if a.enable_p2p_check and a.tp_size > 1 and not a.disable_custom_all_reduce:
            self.log("Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed. To silence this "
                     "warning, specify disable_custom_all_reduce=True explicitly.", level=30)
        self.log(_line("dist_end", elapsed=time.time() - t0, mem=before - local))
        if _line("mem_baseline", mem=0.0) is not None:
            self.log(_line("mem_baseline", mem=before - local))
        self.load_weights(total_gpu)

    def load_weights(self, total_gpu):
        a, facts = self.a, self.facts
        t0 = time.time()
        before = self.free_gib()
        self.log("Load weight begin. avail mem=%.2f GB" % before)
        dtype = a.model_dtype
        scale = 1.0
        if "weights_oom" in self.drills or dtype == "float32":
            dtype, scale = "float32", 2.0
        total = memory.weights_per_rank_bytes(facts, a.tp_size, scale, a.pp_size, self.stage)
        if "weights_load_failed" in self.drills:
            self.no_weights_files(total)
        shards = facts.shards
        n = len(shards)
        load_time = 1.6
        if "slow_load" in self.drills:
            load_time = float(self.drills["slow_load"] or 30)
        step_time = load_time / n
        if self.rank == 0:
            self.log("Using model weights format ['*.safetensors']")
            util.raw("\rLoading safetensors checkpoint shards:   0%% Completed | 0/%d [00:00<?, ?it/s]\n" % n)
        sub = 4
        for k in range(n):
            for _step in range(sub):
                if "hang" in self.drills and self.drills["hang"] != "nccl" and k >= n // 2:
                    self.hang()
                if "host_oom_killed" in self.drills and k >= n // 2 and self.rank == a.tp_size - 1:
                    # the kernel's OOM killer: SIGKILL, nothing logged, nothing freed by the process itself
                    os.kill(os.getpid(), signal.SIGKILL)
                util.sleep(step_time / sub)
                try:
                    self.alloc(total / n / sub)
                except MemoryError as e:
                    self.fail(_frames_runner([
                        (_F + "model_executor/model_runner.py", 545, "initialize", "self.load_model()"),
                        (_F + "model_executor/model_runner.py", 975, "load_model", "self.model = get_model("),
                        (_F + "model_loader/__init__.py", 28, "get_model", "return loader.load_model("),
                        (_F + "model_loader/loader.py", 663, "load_model", "self.load_weights_and_postprocess("),
                        (_F + "model_loader/loader.py", 671, "load_weights_and_postprocess", "model.load_weights(weights)"),
                        (_F + "models/qwen3_5.py", 1203, "load_weights", "weight_loader(param, loaded_weight, shard_id)"),
                        (_F + "layers/linear.py", 797, "weight_loader", "param_data.copy_(loaded_weight)"),
                    ]), str(e))
            if self.rank == 0:
                el = time.time() - t0
                per = el / (k + 1)
                rate = ("%5.2fs/it" % per) if per >= 1 else ("%5.2fit/s" % (1 / per if per else 0))
                util.raw("\rLoading safetensors checkpoint shards: %3.0f%% Completed | %d/%d [%s<%s, %s]\n"
                         % (100.0 * (k + 1) / n, k + 1, n, _mmss(el), _mmss(per * (n - k - 1)), rate))
        after = self.free_gib()
        self.log(_weight_end(time.time() - t0, facts.arch, dtype, after, before - after))
        self.weights_gib = before - after
        self.init_pools(total_gpu)

    def no_weights_files(self, total):
        """0.5.11's DefaultModelLoader.load_model (model_loader/loader.py:680-706) allocates the model's parameters on the
        GPU, then reads the checkpoint: with no *.safetensors / *.bin under --model-path, _prepare_weights raises
        (loader.py:476-479) after the memory is taken, before any "Loading safetensors checkpoint shards" line."""
        self.alloc(total)
        util.sleep(0.2)
        self.fail(_frames_runner([
            (_F + "model_executor/model_runner.py", 625, "initialize", "self.load_model()"),
            (_F + "model_executor/model_runner.py", 1380, "load_model", "self.model = self.loader.load_model("),
            (_F + "model_loader/loader.py", 704, "load_model", "self.load_weights_and_postprocess("),
            (_F + "model_loader/loader.py", 713, "load_weights_and_postprocess", "model.load_weights(weights)"),
            (_F + "models/qwen3_5.py", 1514, "load_weights", "for name, loaded_weight in weights:"),
            (_F + "model_loader/loader.py", 588, "_get_all_weights", "yield from self._get_weights_iterator(primary_weights)"),
            (_F + "model_loader/loader.py", 492, "_get_weights_iterator", "hf_folder, hf_weights_files, use_safetensors = self._prepare_weights("),
            (_F + "model_loader/loader.py", 477, "_prepare_weights", "raise RuntimeError("),
        ]), "RuntimeError: Cannot find any model weights with `%s`" % self.a.model_path)

    def init_pools(self, total_gpu):
        a, facts = self.a, self.facts
        avail = self.allreduce_min("avail", self.free_gib())
        util.sleep(0.05)
        plan = memory.PoolPlan(facts, a, total_gpu, avail, _version(), stage=self.stage)
        self.plan = plan
        if "kv_cache_oom" in self.drills or not plan.fits:
            if _version() >= (0, 5, 11, 0):
                fr = (_F + "model_executor/pool_configurator.py", 41, "configure", "raise RuntimeError(")
                msg = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=%s" % (
                    a.mem_fraction_static,)
            else:
                fr = (_F + "model_executor/model_runner_kv_cache_mixin.py", 415, "init_memory_pool", "raise RuntimeError(")
                msg = ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                       "Current value: self.server_args.mem_fraction_static=%s" % (a.mem_fraction_static,))
            self.fail(_frames_runner([(_F + "model_executor/model_runner.py", 532, "initialize", "self.init_memory_pool(min_per_gpu_memory)"), fr]), msg)
        if plan.max_running_requests <= 0:
            self.fail(_frames_runner([(_F + "managers/tp_worker.py", 282, "__init__",
                                       "assert self.max_running_requests > 0, \"max_running_request is zero\"")]),
                      "AssertionError: max_running_request is zero")
        if plan.max_req_len <= 5:
            self.fail(_frames_runner([(_F + "managers/tp_worker.py", 291, "__init__",
                                       'assert self.max_req_len > 0 and self.max_req_input_len > 0, "Memory pool size is too small"')]),
                      "AssertionError: Memory pool size is too small")
        self.alloc(plan.req_to_token_bytes)
        if facts.hybrid:
            self.alloc(plan.mamba_bytes)
            if a.speculative_algorithm is not None:
                self.log("Mamba Cache is allocated. max_mamba_cache_size: %d, conv_state size: %.2fGB, ssm_state size: %.2fGB "
                         "intermediate_ssm_state_cache size: %.2fGB intermediate_conv_window_cache size: %.2fGB "
                         % (plan.max_mamba_cache_size, plan.conv_bytes / GIB, plan.ssm_bytes / GIB, plan.inter_ssm_bytes / GIB,
                            plan.inter_conv_bytes / GIB))
            else:
                self.log("Mamba Cache is allocated. max_mamba_cache_size: %d, conv_state size: %.2fGB, ssm_state size: %.2fGB "
                         % (plan.max_mamba_cache_size, plan.conv_bytes / GIB, plan.ssm_bytes / GIB))
        util.sleep(0.05)
        self.alloc(plan.k_bytes + plan.v_bytes)
        self.kv_gib = (plan.k_bytes + plan.v_bytes) / GIB
        self.log(_line("kv_alloc", dtype=_torch_dtype(a), tokens=plan.max_total_num_tokens, k=plan.k_bytes / GIB, v=plan.v_bytes / GIB))
        self.log("Memory pool end. avail mem=%.2f GB" % self.free_gib())
        self.graph_gib = 0.0
        if not a.disable_cuda_graph:
            self.capture("cuda graph", memory.cuda_graph_mib(a.cuda_graph_max_bs), 0.5 + (1.5 if a.enable_torch_compile else 0))
        if a.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE") and facts.mtp_layers > 0:
            self.init_draft(total_gpu)
        if self.rank == 0:
            self.log("max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, context_len=%d, "
                     "available_gpu_mem=%.2f GB" % (plan.max_total_num_tokens, a.chunked_prefill_size, a.max_prefill_tokens,
                                                    plan.max_running_requests, a.context_length, self.free_gib()))
        self.conn.send(("ready", self.rank, {
            "status": "ready", "max_total_num_tokens": plan.max_total_num_tokens, "max_req_input_len": plan.max_req_len - 5,
            "max_running_requests": plan.max_running_requests, "plan": plan.as_dict(),
            "memory_usage": {"weight": round(self.weights_gib, 2), "kvcache": round(self.kv_gib, 2),
                             "token_capacity": plan.max_total_num_tokens, "graph": round(self.graph_gib, 2)},
            "gpu_index": self.gpu, "used_mib": self.used / MIB}))
        self.serve()

    def capture(self, what, mib, seconds, show_bar=True):
        a = self.a
        before = self.free_gib()
        self.log("Capture %s begin. This can take up to several minutes. avail mem=%.2f GB" % (what, before))
        t0 = time.time()
        if what == "cuda graph":
            # the first forward passes: Triton's launchers and FlashInfer's decode JIT module (toolchain.py); 0.5.11 wraps
            # a RuntimeError out of the capture (cuda_graph_runner.py:711-718), anything else propagates as it is
            try:
                self.toolchain.capture()
            except toolchain.FirstForwardError as e:
                self.fail_text(toolchain.render(_frames_runner(toolchain.CAPTURE_OUTER), e, _CAPTURE_FAILED_MSG))
        if a.speculative_algorithm is not None:
            bss = list(range(1, 9)) + list(range(10, a.cuda_graph_max_bs + 1, 2))
        else:
            bss = [1, 2, 4, 8] + list(range(16, a.cuda_graph_max_bs + 1, 8))
        bss = [b for b in bss if b <= a.cuda_graph_max_bs] or [1]
        n = len(bss)
        fail = None
        steps = 4
        for i in range(steps):
            util.sleep(seconds / steps)
            if "cuda_graph_failed" in self.drills and what == "cuda graph" and i == steps // 2:
                fail = "drill"
                break
            try:
                self.alloc(mib * MIB / steps)
            except MemoryError as e:
                fail = str(e).replace("torch.OutOfMemoryError: ", "")
                break
            if show_bar and self.rank == 0 and what == "cuda graph":
                done = int(n * (i + 1) / steps)
                util.raw("\rCapturing batches (bs=%d avail_mem=%.2f GB): %3d%%|%s| %d/%d [%s<?, ?it/s]"
                         % (bss[max(n - done, 0) if done < n else 0], self.free_gib(), 100 * done // n,
                            ("\u2588" * (10 * done // n)).ljust(10), done, n, _mmss(time.time() - t0)))
        if show_bar and self.rank == 0 and what == "cuda graph":
            util.raw("\n")
        if fail is not None:
            if fail == "drill":
                fail = ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU %d has a total capacity of %.2f GiB of which 301.94 MiB is free. "
                        "Including non-PyTorch memory, this process has %.2f GiB memory in use."
                        % (self.cuda_index, gpustate.gpu_info(self.gpu)["mem_total_mib"] / 1024.0, self.used / GIB))
            self.fail(_frames_runner([
                (_F + "model_executor/model_runner.py", 560, "initialize", "self.init_device_graphs()"),
                (_F + "model_executor/model_runner.py", 2150, "init_device_graphs", "self.graph_runner = graph_runners[self.device](self)"),
                (_F + "model_executor/cuda_graph_runner.py", 370, "__init__", "raise Exception("),
            ]), "Exception: Capture cuda graph failed: %s\n%s" % (fail, _CAPTURE_FAILED_MSG))
        after = self.free_gib()
        self.graph_gib += before - after
        self.log("Capture %s end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB." % (what, time.time() - t0, before - after, after))

    def init_draft(self, total_gpu):
        a, facts, plan = self.a, self.facts, self.plan
        t0 = time.time()
        # from 0.5.21 a draft worker reuses the target's groups (0.5.21 distributed/bootstrap.py:102-103): only its memory
        # baseline line
        if _line("mem_baseline", mem=0.0) is None:
            self.log(_line("dist_begin"))
            self.log(_line("dist_end", elapsed=time.time() - t0, mem=0.0))
        else:
            self.log(_line("mem_baseline", mem=0.0))
        before = self.free_gib()
        self.log("Load weight begin. avail mem=%.2f GB" % before)
        t0 = time.time()
        util.sleep(0.15)
        try:
            self.alloc(memory.draft_weights_per_rank_bytes(facts, a.tp_size))
            after = self.free_gib()
            draft_type = "Qwen3_5ForCausalLMMTP" if facts.arch.startswith("Qwen3_5") else facts.arch.replace("ForConditionalGeneration", "ForCausalLM") + "MTP"
            self.log(_weight_end(time.time() - t0, draft_type, a.model_dtype, after, before - after))
            self.alloc(plan.draft_k_bytes + plan.draft_v_bytes)
        except MemoryError as e:
            self.fail(_frames_runner([
                (_F + "managers/scheduler.py", 560, "init_model_worker", "self.draft_worker = DraftWorkerClass(**draft_worker_kwargs)"),
                (_F + "speculative/eagle_worker.py", 150, "__init__", "super().__init__("),
                (_F + "managers/tp_worker.py", 330, "_init_model_runner", "self._model_runner = ModelRunner("),
            ]), str(e))
        self.log(_line("kv_alloc", dtype=_torch_dtype(a), tokens=plan.max_total_num_tokens, k=plan.draft_k_bytes / GIB,
                       v=plan.draft_v_bytes / GIB))
        self.log("Memory pool end. avail mem=%.2f GB" % self.free_gib())
        if not a.disable_cuda_graph:
            self.capture("draft cuda graph", memory.draft_graph_mib(a.cuda_graph_max_bs), 0.2, show_bar=False)
            self.capture("draft extend cuda graph", memory.draft_graph_mib(a.cuda_graph_max_bs), 0.15, show_bar=False)

    def serve(self):
        if multinode.nnodes(self.a) > 1 and self.a.node_rank >= 1 and self.a.disable_cuda_graph:
            # a node of rank >= 1 gets no request in the stand-in: its first forward is taken to be now (README)
            self.first_request(True)
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "forward":
                # the main process's first requests (server.py Main.first_forwards): msg[1] is whether all are greedy
                self.first_request(msg[1])
                self.conn.send(("forwarded", self.rank))
            elif msg[0] == "warmup":
                try:
                    self.alloc(memory.WARMUP_ACTIVATION_MIB * MIB)
                except MemoryError:
                    pass
            elif msg[0] == "exit":
                break
        if self.leftover:
            # the drill: survive the main process, keep the memory until killed by PID
            while True:
                time.sleep(3600)
        _release_and_exit(0)


def _mmss(sec):
    sec = int(sec)
    return "%02d:%02d" % (sec // 60, sec % 60)


def _weight_end(elapsed, type_name, dtype, avail, usage):
    """0.5.10+ model_executor/model_runner.py:1467-1474 (0.5.11): no dtype (a quantized model adds its quant_str, not
    modelled); 0.5.9 model_runner.py:1040-1047 has dtype=torch.<dtype>."""
    if _version() >= (0, 5, 10, 0):
        return "Load weight end. elapsed=%.2f s, type=%s, avail mem=%.2f GB, mem usage=%.2f GB." % (elapsed, type_name, avail, usage)
    return ("Load weight end. elapsed=%.2f s, type=%s, dtype=torch.%s, avail mem=%.2f GB, mem usage=%.2f GB."
            % (elapsed, type_name, dtype, avail, usage))


def _line(name, **values):
    """A startup line in the wording of the release the stand-in is installed as (the release table's "log")."""
    from sglang.srt._kpro_lab import releases
    from sglang.version import __version__
    return releases.log_line(name, __version__, **values)


def _torch_dtype(a):
    """The KV pool's dtype as the real pool prints it (self.dtype, a torch dtype: "torch.bfloat16")."""
    kv = a.kv_cache_dtype if getattr(a, "kv_cache_dtype", None) not in (None, "auto") else a.model_dtype
    return "torch." + {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(kv, kv)


def _version():
    from sglang.srt._kpro_lab.args import version_tuple
    return version_tuple()


def _init_failed_traceback(a, facts):
    """A processor-loading failure inside Scheduler.__init__, before the model worker (no GPU use)."""
    tf = "transformers/"
    p = a.model_path
    inner = util.fake_traceback([
        (tf + "utils/hub.py", 479, "cached_files", "hf_hub_download("),
        ("huggingface_hub/utils/_validators.py", 106, "_inner_fn", "validate_repo_id(arg_value)"),
        ("huggingface_hub/file_download.py", 1010, "hf_hub_download", "return _hf_hub_download_to_cache_dir("),
        ("huggingface_hub/file_download.py", 1073, "_hf_hub_download_to_cache_dir",
         "(url_to_download, etag, commit_hash, expected_size, xet_file_data, head_call_error) = _get_metadata_or_catch_error("),
        ("huggingface_hub/file_download.py", 1546, "_get_metadata_or_catch_error", "metadata = get_hf_file_metadata("),
        ("huggingface_hub/utils/_validators.py", 106, "_inner_fn", "validate_repo_id(arg_value)"),
        ("huggingface_hub/utils/_validators.py", 106, "_inner_fn", "validate_repo_id(arg_value)"),
        ("huggingface_hub/utils/_validators.py", 154, "validate_repo_id", "raise HFValidationError("),
    ], "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '%s'. "
       "Use `repo_type` argument if needed." % p)
    outer_frames = [
        (_F + "managers/scheduler.py", 3175, "run_scheduler_process", "scheduler = Scheduler("),
        (_F + "managers/scheduler.py", 340, "__init__", "self.init_tokenizer()"),
        (_F + "managers/scheduler.py", 702, "init_tokenizer", "self.processor = get_processor("),
        (_F + "utils/hf_transformers_utils.py", 540, "get_processor", "processor = AutoProcessor.from_pretrained("),
        (tf + "models/auto/processing_auto.py", 386, "from_pretrained", "return processor_class.from_pretrained("),
        (tf + "processing_utils.py", 1394, "from_pretrained", "args = cls._get_arguments_from_pretrained(pretrained_model_name_or_path, **kwargs)"),
        (tf + "processing_utils.py", 1453, "_get_arguments_from_pretrained",
         "args.append(attribute_class.from_pretrained(pretrained_model_name_or_path, **kwargs))"),
        (tf + "models/auto/image_processing_auto.py", 510, "from_pretrained",
         "config_dict, _ = ImageProcessingMixin.get_image_processor_dict(pretrained_model_name_or_path, **kwargs)"),
        (tf + "image_processing_base.py", 341, "get_image_processor_dict", "resolved_image_processor_file = cached_file("),
        (tf + "utils/hub.py", 322, "cached_file", "file = cached_files(path_or_repo_id=path_or_repo_id, filenames=[filename], **kwargs)"),
        (tf + "utils/hub.py", 531, "cached_files", "resolved_files = ["),
        (tf + "utils/hub.py", 532, "<listcomp>", "_get_cache_file_to_return(path_or_repo_id, filename, cache_dir, revision, repo_type)"),
        (tf + "utils/hub.py", 143, "_get_cache_file_to_return", "resolved_file = try_to_load_from_cache("),
        ("huggingface_hub/utils/_validators.py", 106, "_inner_fn", "validate_repo_id(arg_value)"),
        ("huggingface_hub/utils/_validators.py", 160, "validate_repo_id", "raise HFValidationError("),
    ]
    outer = util.fake_traceback(outer_frames, "OSError: Can't load image processor for '%s'. If you were trying to load it from "
                                "'https://huggingface.co/models', make sure you don't have a local directory with the same name. Otherwise, "
                                "make sure '%s' is the correct path to a directory containing a preprocessor_config.json file" % (p, p))
    combined = inner + "\nDuring handling of the above exception, another exception occurred:\n\n" + outer
    # returned as (frames, exc_line) for fail(): frames empty, the whole text as exc_line
    return [], combined.replace("Traceback (most recent call last):\n", "", 1).rstrip("\n")


def _release_and_exit(code, sig=None):
    def go():
        try:
            gpustate.release()
        except Exception:
            pass
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            time.sleep(1)
        os._exit(code)
    gpustate.run_unlocked(go)


def _on_term(signum, frame):
    _release_and_exit(128 + signum, signum)


def run_scheduler_process(rank, conn, server_args, facts, gpu_index, cuda_index, drills, ppid):
    leftover = "leftover_child" in drills and rank == server_args.tp_size - 1
    if not leftover:
        util.set_pdeathsig(signal.SIGTERM)
    if os.getppid() != ppid and not leftover:
        os._exit(1)
    util.set_proc_title("sglang::scheduler_TP%d" % rank)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    util.set_levels(server_args.log_level, server_args.log_level_http)
    r = Rank(rank, conn, server_args, facts, gpu_index, cuda_index, drills, ppid)
    try:
        r.run()
    except SystemExit:
        raise
    except BaseException:
        import traceback
        r.log("Scheduler hit an exception: %s" % traceback.format_exc(), level=40)
        try:
            os.kill(ppid, signal.SIGQUIT)
        except OSError:
            pass
        while True:
            time.sleep(3600)


def run_detokenizer_process(ppid):
    util.set_pdeathsig(signal.SIGTERM)
    if os.getppid() != ppid:
        os._exit(1)
    util.set_proc_title("sglang::detokenizer")
    signal.signal(signal.SIGTERM, lambda s, f: os._exit(128 + s))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        time.sleep(3600)
        if os.getppid() != ppid:
            sys.exit(0)
