# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of kpro.gpu_serving.run_lock: names this run, waits a bounded time for another run's lock,
and takes over a lock whose ansible-playbook process on this controller is gone (which only the controller can see)."""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import run_lock as rl
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

MODULE = "kpro.gpu_serving.run_lock"


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("vmid", "state", "max_age", "wait", "poll", "lock_dir"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        try:
            result.update(self._take_or_release(task_vars))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _take_or_release(self, task_vars):
        args = dict(self._task.args, owner=rl.controller_owner())
        wait, poll = int(args.get("wait", 120)), max(float(args.get("poll", 5)), 0.5)
        deadline, waited_on = time.monotonic() + wait, None
        while True:
            res = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
            if res.get("failed") or res.get("taken") or args.get("state") == "released" or self._task.check_mode:
                return dict(res, owner=args["owner"], waited_on=waited_on,
                            changed=False)  # the lease is the run's bookkeeping, not a change of the target
            holder = res["holder"]
            gone = rl.holder_gone(holder, args["owner"])
            args["take_over"] = holder.get("run_id") if gone else None
            if gone:
                continue
            waited_on = holder
            if time.monotonic() >= deadline:
                f = Failure("run_locked", "container %s is being changed by another run: %s (lock %s on the node); waited %d s"
                            % (args.get("vmid"), rl.describe(holder), res.get("path"), wait), remedy=(
                                "wait for that run to end and run again (or raise kpro_lock_wait). A run that died on "
                                "another controller holds the lock until kpro_lock_max_age; when you know it is gone, "
                                "empty the file on the node (: > %s)" % res.get("path")), evidence=[res.get("path")])
                return dict(res, failed=True, **dict(f.result(), msg=f.message()))
            time.sleep(poll)
