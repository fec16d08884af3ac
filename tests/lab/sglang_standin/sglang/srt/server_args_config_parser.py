"""``sglang.srt.server_args_config_parser`` of the lab stand-in: the one class tools use, as 0.5.11's
(sglang/srt/server_args_config_parser.py:16 ConfigArgumentMerger, merge_config_with_args), over the stand-in's
merge (``_kpro_lab.args.merge_config``: the file's keys before the command line's, the same refusals)."""

from sglang.srt._kpro_lab import args as _args


class ConfigArgumentMerger(object):
    def __init__(self, parser=None, boolean_actions=None):
        self.parser = parser

    def merge_config_with_args(self, cli_args):
        return _args.merge_config(list(cli_args))
