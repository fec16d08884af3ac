"""One run at a time (issue 30): the lease file on the node (run_lock) and the controller's wait (the action plugin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from ansible_collections.kpro.gpu_serving.plugins.action import run_lock as action
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import run_lock as rl

BOOT = "b0"


def owner(pid, host="ctl-a", start=1):
    return {"controller": host, "pid": pid, "pid_start": start, "run_id": "%s:%d:%s" % (host, pid, start), "started": "t%d" % pid}


def test_one_holder_renewed_by_its_own_run_and_released_only_by_it(tmp_path):
    path = str(tmp_path / "kpro-gpu-serving-129.lock")
    a, b = owner(100), owner(200)
    assert rl.take(path, a, 3600, now=lambda: 10.0, boot=BOOT) == (True, None, None)
    taken, holder, why = rl.take(path, b, 3600, now=lambda: 20.0, boot=BOOT)
    assert (taken, holder["run_id"], why) == (False, a["run_id"], None)
    assert rl.take(path, a, 3600, now=lambda: 30.0, boot=BOOT)[0] is True   # a later stage of the same run
    assert json.load(open(path))["taken_at"] == 30.0
    assert rl.release(path, b) is False and json.load(open(path))["run_id"] == a["run_id"]
    assert rl.release(path, a) is True and open(path).read() == ""
    assert rl.take(path, b, 3600, now=lambda: 40.0, boot=BOOT)[0] is True


@pytest.mark.parametrize("now, boot, take_over, why", [
    (5000.0, BOOT, None, "took it 4990 s ago, longer than a run lasts (max_age 3600 s)"),
    (20.0, "b1", None, "the node rebooted since ansible-playbook PID 100 on controller ctl-a"),
    (20.0, BOOT, "ctl-a:100:1", "ansible-playbook PID 100 on controller ctl-a, started t100 is gone"),
])
def test_a_stale_lock_is_taken_over_naming_its_holder(tmp_path, now, boot, take_over, why):
    path = str(tmp_path / "l")
    rl.take(path, owner(100), 3600, now=lambda: 10.0, boot=BOOT)
    taken, holder, reason = rl.take(path, owner(200), 3600, take_over=take_over, now=lambda: now, boot=boot)
    assert taken and holder["pid"] == 100 and why in reason
    assert json.load(open(path))["run_id"] == "ctl-a:200:1"


def test_take_over_names_the_holder_it_was_told_about_only(tmp_path):
    path = str(tmp_path / "l")
    rl.take(path, owner(100), 3600, now=lambda: 10.0, boot=BOOT)
    assert rl.take(path, owner(200), 3600, take_over="ctl-a:99:1", now=lambda: 11.0, boot=BOOT)[0] is False


def test_holder_gone_only_for_this_controllers_dead_processes():
    me = rl.controller_owner(pid=os.getpid())
    assert not rl.holder_gone(dict(me), me)                                   # alive, same start
    assert rl.holder_gone(dict(me, pid_start=(me["pid_start"] or 0) + 1), me)  # the PID was reused since
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert rl.holder_gone(dict(me, pid=dead.pid), me)
    assert not rl.holder_gone(dict(me, pid=dead.pid, controller="elsewhere"), me)  # another controller: max_age decides


def _action(tmp_path, me, wait, check_mode=False):
    """The action plugin with its module call running the module's logic on a lock in tmp_path."""
    path = str(tmp_path / "kpro-gpu-serving-129.lock")
    task = mock.MagicMock(args={"vmid": 129, "wait": wait, "poll": 0.5}, check_mode=check_mode)
    act = action.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, None, None)
    calls = []

    def execute(module_name, module_args, task_vars):
        calls.append(dict(module_args))
        if module_args.get("state") == "released":
            return {"released": rl.release(path, module_args["owner"]), "path": path}
        taken, holder, why = rl.take(path, module_args["owner"], 3600, module_args.get("take_over"), boot=BOOT)
        return {"taken": taken, "holder": holder, "took_over": why, "path": path}

    act._execute_module = execute
    with mock.patch.object(rl, "controller_owner", return_value=me):
        return act._take_or_release({}), calls, path


def test_a_second_run_waits_then_fails_naming_the_holder(tmp_path):
    other = owner(os.getpid(), host="ctl-b", start=7)   # a live run of another controller
    rl.take(str(tmp_path / "kpro-gpu-serving-129.lock"), other, 3600, boot=BOOT)
    res, calls, path = _action(tmp_path, owner(300), wait=1)
    assert res["failed"] and res["phase"] == "run_locked" and len(calls) >= 2
    assert ("container 129 is being changed by another run: ansible-playbook PID %d on controller ctl-b, started t%d"
            % (os.getpid(), os.getpid())) in res["msg"]
    assert "waited 1 s" in res["msg"] and "Remedy: wait for that run" in res["msg"] and res["evidence"] == [path]
    assert json.load(open(path))["run_id"] == other["run_id"]


def test_a_lock_of_a_dead_run_of_this_controller_is_taken_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = rl.controller_owner(pid=os.getpid())
    rl.take(str(tmp_path / "kpro-gpu-serving-129.lock"), dict(me, pid=dead.pid, run_id="x:%d" % dead.pid), 3600, boot=BOOT)
    res, calls, path = _action(tmp_path, me, wait=60)
    assert res["taken"] and not res.get("failed") and res["changed"] is False
    assert "ansible-playbook PID %d" % dead.pid in res["took_over"] and calls[-1]["take_over"] == "x:%d" % dead.pid
