# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: progress
type: aggregate
short_description: Show the progress of the collection's long steps at default verbosity
version_added: "0.2.0"
description:
  - An Ansible module cannot stream output, so the collection runs its long steps (the model download, the driver
    install, the server's gate) in the background and polls them. This callback prints, next to the stdout callback's
    own lines, what each poll says at default verbosity.
  - On a retry of a task whose result has C(progress) (the download's wait), prints C(progress [host] task - <progress>).
  - On each poll of a background task (C(async) with C(poll) > 0), prints a heartbeat with the task's name and the
    seconds it has run, so a long wait (a driver build, up to 30 minutes of model loading) is never silent.
  - Enable it with C(callbacks_enabled = kpro.gpu_serving.progress) in ansible.cfg (the checkout's ansible.cfg does).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
requirements:
  - enabled in ansible.cfg (C(callbacks_enabled))
"""

import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    """Progress lines for long steps. Not a stdout callback: it adds lines, the stdout callback keeps its own."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "kpro.gpu_serving.progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._task = (None, None)   # the running task's name and start: an async poll's result names async_status

    def _name(self, result):
        return result.task_name or str(result._task)  # pylint: disable=protected-access

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task = (task.get_name(), time.time())

    def v2_runner_retry(self, result):
        line = result._result.get("progress")  # pylint: disable=protected-access
        if line:
            self._display.display("progress [%s] %s - %s" % (result._host.get_name(), self._name(result), line))  # pylint: disable=protected-access

    def v2_runner_on_async_poll(self, result):
        name, t0 = self._task
        self._display.display("waiting [%s] %s - %d s, still running" % (  # pylint: disable=protected-access
            result._host.get_name(), name or self._name(result), time.time() - (t0 or time.time())))
