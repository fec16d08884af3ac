"""``sglang.srt.server_args`` of the lab stand-in: what tools import from the real module
(``ServerArgs.add_cli_args(parser)``, ``prepare_server_args(argv)``), with the real 0.5.11 flag names."""

from sglang.srt._kpro_lab import args as _args


class ServerArgs(object):
    """Only the class-level API of the real dataclass that tools use."""

    @staticmethod
    def add_cli_args(parser):
        _args.add_cli_args(parser)


def prepare_server_args(argv):
    return _args.prepare(argv)[0]
