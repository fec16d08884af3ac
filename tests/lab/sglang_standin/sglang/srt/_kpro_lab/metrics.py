"""GET /metrics of the stand-in (served only with --enable-metrics): the real server's Prometheus names, types, help
texts and labels, with values that follow the stand-in's requests.

The real server (0.5.11 wheel) mounts prometheus_client's app at /metrics only when --enable-metrics is given
(entrypoints/http_server.py:303-305, utils/common.py:1412-1422: a MultiProcessCollector, so a family shows once a
process has written it, label names sorted, no _created samples); the API key never guards it (utils/auth.py:100).
Names and help texts: observability/metrics_collector.py (the line beside each row; 0.5.23 has the same names and
labels, its metrics_collector.py:365-405, 1290, 1856-2068). The scheduler's gauges carry model_name, engine_type,
tp_rank, pp_rank, moe_ep_rank (observability/scheduler_metrics_mixin.py:133-139), the tokenizer's counters and
histograms model_name and engine_type (managers/tokenizer_manager.py:461-464).
"""

import threading
import time

# (name, type, help, where in 0.5.11's metrics_collector.py)
_SCHEDULER = (
    ("sglang:num_running_reqs", "gauge", "The number of running requests.", 200),
    ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", 206),
    ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", 218),
    ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", 224),
    ("sglang:token_usage", "gauge", "The token usage.", 240),
    ("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", 838),
)
_SPEC = ("sglang:spec_accept_length", "gauge", "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).", 296)
_TOKENIZER = (
    ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", 1207),
    ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", 1212),
    ("sglang:num_requests_total", "counter", "Number of requests processed.", 1279),
)
# the default buckets (metrics_collector.py:1297-1345)
_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
_E2E = _TTFT + (600, 1200, 1800, 2400)
_HISTOGRAMS = (
    ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT, 1372),
    ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", _E2E, 1386),
)
IDLE_LOG_S = 30   # an idle scheduler logs running 0, queue 0, throughput 0 every 30 s (scheduler_runtime_checker_mixin.py:493-528)


def _labels(d):
    return "{%s}" % ",".join('%s="%s"' % (k, d[k]) for k in sorted(d))


class Metrics(object):
    """What the scheduler and the tokenizer manager would have written; thread-safe (one HTTP thread per request)."""

    def __init__(self, served_model_name, limits, speculative=False):
        """``limits``: () -> (the KV pool's tokens, max running requests), rank 0's once it has started."""
        self.tok = {"model_name": served_model_name, "engine_type": "unified"}
        self.sched = dict(self.tok, tp_rank=0, pp_rank=0, moe_ep_rank=0)
        self.limits = limits
        self.speculative = speculative
        self.lock = threading.Lock()
        self.gauges = {}           # set as the scheduler logs them: at a prefill, a decode log and when idle
        self.counters = dict((n, 0.0) for n, _t, _h, _l in _TOKENIZER)
        self.hist = dict((n, [0] * (len(b) + 1) + [0.0]) for n, _h, b, _l in _HISTOGRAMS)   # bucket counts, +Inf, sum
        self.inflight = {}         # request id -> tokens it holds in the KV pool
        self.finished = 0
        self.last_log = time.time()

    def _log_stats(self, throughput):
        pool, max_running = self.limits()
        n = len(self.inflight)
        running = min(n, max_running or n)
        self.gauges.update({"sglang:num_running_reqs": running, "sglang:num_queue_reqs": n - running,
                            "sglang:gen_throughput": throughput, "sglang:cache_hit_rate": 0.0,
                            "sglang:token_usage": round(sum(self.inflight.values()) / float(pool or 1), 4) if pool else 0.0})
        self.last_log = time.time()

    def prefill(self, rid, prompt_tokens):
        """A request entered the batch (the scheduler's prefill log)."""
        with self.lock:
            self.inflight[rid] = prompt_tokens
            self._log_stats(self.gauges.get("sglang:gen_throughput", 0.0))

    def decode(self, rid, tokens, throughput):
        """A decode log of the running batch: its throughput and the tokens this request holds."""
        with self.lock:
            if rid in self.inflight:
                self.inflight[rid] = tokens
            self._log_stats(throughput)

    def _observe(self, name, value):
        h = self.hist[name]
        buckets = [b for n, _h, b, _l in _HISTOGRAMS if n == name][0]
        for i, le in enumerate(buckets):
            if value <= le:
                h[i] += 1
        h[len(buckets)] += 1
        h[-1] += value

    def finish(self, rid, prompt_tokens, completion_tokens, ttft, e2e):
        """A finished request (TokenizerMetricsCollector.observe_one_finished_request, 1394-1437)."""
        with self.lock:
            self.inflight.pop(rid, None)
            self.counters["sglang:prompt_tokens_total"] += prompt_tokens
            self.counters["sglang:generation_tokens_total"] += completion_tokens
            self.counters["sglang:num_requests_total"] += 1
            self._observe("sglang:time_to_first_token_seconds", ttft)
            self._observe("sglang:e2e_request_latency_seconds", e2e)
            self.finished += 1

    def render(self, spec_accept_length=None):
        """The exposition text a scrape gets."""
        with self.lock:
            if not self.inflight and time.time() > self.last_log + IDLE_LOG_S and self.gauges:
                self._log_stats(0.0)
            gauges = dict(self.gauges, **{"sglang:max_total_num_tokens": float(self.limits()[0] or 0)})
            if self.speculative and spec_accept_length is not None and self.finished:
                gauges[_SPEC[0]] = spec_accept_length
            out = []
            for name, typ, doc, _line in _SCHEDULER + (_SPEC,):
                if name in gauges:
                    out += ["# HELP %s %s" % (name, doc), "# TYPE %s %s" % (name, typ), "%s%s %s" % (name, _labels(self.sched), float(gauges[name]))]
            if self.finished:
                for name, typ, doc, _line in _TOKENIZER:
                    out += ["# HELP %s %s" % (name, doc), "# TYPE %s %s" % (name, typ), "%s%s %s" % (name, _labels(self.tok), self.counters[name])]
                for name, doc, buckets, _line in _HISTOGRAMS:
                    out += self._histogram(name, doc, buckets)
            return "\n".join(out) + "\n"

    def _histogram(self, name, doc, buckets):
        h = self.hist[name]
        out = ["# HELP %s %s" % (name, doc), "# TYPE %s histogram" % name, "%s_sum%s %s" % (name, _labels(self.tok), h[-1])]
        for i, le in enumerate(tuple(float(b) for b in buckets) + ("+Inf",)):
            out.append("%s_bucket%s %s" % (name, _labels(dict(self.tok, le=le)), float(h[i])))
        return out + ["%s_count%s %s" % (name, _labels(self.tok), float(h[len(buckets)]))]
