"""``python -m sglang.launch_server`` (lab stand-in)."""

import sys


def main(argv=None):
    from sglang.srt._kpro_lab.server import launch
    return launch(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
