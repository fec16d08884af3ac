"""``sglang serve ...`` console script (lab stand-in)."""

import sys


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] != "serve":
        sys.stderr.write("usage: sglang serve [server args]\n")
        sys.exit(2)
    from sglang.srt._kpro_lab.server import launch
    return launch(argv[1:])
