"""The README's picture of the verify's metrics: Prometheus's graph page rendered by headless Chromium.

    python3 tests/tools/prometheus_screenshot.py http://10.213.5.1:18610 docs/img/verify-prometheus.png [--range 60]

Debian's ``prometheus`` (bookworm: 2.42) ships the classic web UI (/graph, rickshaw graphs), whose page takes the
queries from its URL (``g0.expr``, ``g0.tab=0`` the graph tab, ``g0.range_input`` the range ending now). Chromium is
Debian's ``chromium``, installed by hand for this (``apt-get install --no-install-recommends chromium``), not by
``make setup``: no test needs it. The lab test tests/lab_tests/test_verify.py calls this with
``KPGS_PROMETHEUS_SCREENSHOT=<png>`` while its Prometheus holds the lab's data (docs/verify.md).

Chromium is kept off every other address: no host but the URL's resolves (``--host-resolver-rules``)
and its background fetches (component updates, sync, pings) are switched off.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse

# the drift findings (one series per check and phase while found) and the verdict (1 clean, 0 an error finding)
EXPRS = ("kpro_gpu_serving_verify_finding", "kpro_gpu_serving_verify_ok")
QUIET = ("--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
         "--disable-domain-reliability", "--no-pings", "--no-first-run")


def graph_url(base, range_s, exprs=EXPRS):
    """The classic UI's graph page with one graph per expression over the last ``range_s`` seconds."""
    query = {}
    for i, expr in enumerate(exprs):
        query.update({"g%d.expr" % i: expr, "g%d.tab" % i: "0", "g%d.range_input" % i: "%ds" % range_s})
    return base.rstrip("/") + "/graph?" + urllib.parse.urlencode(query)


def shoot(url, out, size=(1000, 1500)):
    """A PNG of ``url`` at ``out`` (tall enough for two graphs); the page's queries get virtual time to come back and draw."""
    out = os.path.abspath(out)
    profile = tempfile.mkdtemp(prefix="kpgs-chromium-")
    try:
        # --no-sandbox: Chromium's sandbox refuses to run as root, which the lab tests are
        argv = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + profile,
                "--window-size=%d,%d" % size, "--virtual-time-budget=10000", "--screenshot=" + out] + list(QUIET)
        # every name and address but the page's own fails to resolve (IP literals go through the rules too)
        argv += ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE %s" % urllib.parse.urlsplit(url).hostname, url]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120,
                           check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if r.returncode != 0 or not os.path.exists(out):
        raise SystemExit("chromium failed (%d): %s" % (r.returncode, r.stdout[-2000:]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("prometheus", help="Prometheus's base URL, e.g. http://10.213.5.1:18610")
    ap.add_argument("png", help="where the PNG goes")
    ap.add_argument("--range", type=int, default=120, help="seconds the graphs cover, ending now (default 120)")
    args = ap.parse_args(argv)
    path = shoot(graph_url(args.prometheus, args.range), args.png)
    print("%s: %d bytes" % (path, os.path.getsize(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
