"""The progress callback prints the download's progress on each retry and a heartbeat on each async poll."""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.callback.progress import CallbackModule


class Display(object):
    def __init__(self):
        self.lines = []

    def display(self, msg, **kw):
        self.lines.append(msg)


class Host(object):
    def get_name(self):
        return "ct129"


class Task(object):
    _uuid = "t1"

    def __str__(self):
        return "TASK: Wait"

    def get_name(self):
        return "kpro.gpu_serving.sglang_server : Gate the launch until it really serves"


class Result(object):
    def __init__(self, result, name="Wait for the download"):
        self._result, self._host, self._task, self.task_name = result, Host(), Task(), name


def callback():
    cb = CallbackModule()
    cb._display = Display()  # pylint: disable=protected-access
    return cb


def test_retry_with_progress_prints_it_and_without_prints_nothing():
    cb = callback()
    cb.v2_runner_retry(Result({"progress": "1.0 GiB of 2.0 GiB (50.0%), 10.0 MiB/s, 1 of 2 files", "attempts": 1, "retries": 9}))
    cb.v2_runner_retry(Result({"attempts": 2, "retries": 9}))
    assert cb._display.lines == ["progress [ct129] Wait for the download - 1.0 GiB of 2.0 GiB (50.0%), 10.0 MiB/s, 1 of 2 files"]


def test_async_poll_is_a_heartbeat_with_the_task_and_the_seconds():
    cb = callback()
    cb.v2_playbook_on_task_start(Task(), False)
    # the poll's own result names Ansible's async_status; the line names the task that runs in the background
    cb.v2_runner_on_async_poll(Result({"started": 1, "finished": 0}, name="async_status"))
    assert cb._display.lines == ["waiting [ct129] kpro.gpu_serving.sglang_server : Gate the launch until it really serves - 0 s, still running"]
