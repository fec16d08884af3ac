# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's units, order, batches and the fleet's status lines."""

from __future__ import annotations

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import rollout

GROUPS = {"proxmox_hosts": ["gpu-a", "gpu-b", "gpu-c", "gpu-d"], "gpu_containers": ["ct201", "ct202", "ct301", "ct302"]}
TWO = {"nnodes": 2, "dist_init_addr": "192.0.2.31:20000", "tp_size": 4}
HOSTVARS = {
    "gpu-a": {"kpro_rollout_serial": 1}, "gpu-b": {}, "gpu-c": {}, "gpu-d": {},
    "ct201": {"pve_node_host": "gpu-a"}, "ct202": {"pve_node_host": "gpu-b"},
    "ct301": {"pve_node_host": "gpu-c", "sglang_server_options": dict(TWO, node_rank=0)},
    "ct302": {"pve_node_host": "gpu-d", "sglang_server_options": dict(TWO, node_rank=1)},
}


def test_units_pair_each_host_with_its_containers_and_merge_a_multi_node_server():
    assert rollout.units(GROUPS["proxmox_hosts"], GROUPS["gpu_containers"], HOSTVARS) == [
        ["gpu-a", "ct201"], ["gpu-b", "ct202"], ["gpu-c", "ct301", "gpu-d", "ct302"]]


def test_plan_one_host_at_a_time_by_default():
    p = rollout.plan(GROUPS, HOSTVARS)
    assert p["hosts"] == ["gpu-a", "ct201", "gpu-b", "ct202", "gpu-c", "ct301", "gpu-d", "ct302"]
    assert p["serial"] == [2, 2, 4] and p["max_fail_percentage"] == 0
    assert p["batches"][2] == ["gpu-c", "ct301", "gpu-d", "ct302"]


def test_plan_batch_size_and_all_at_once():
    assert rollout.plan(GROUPS, HOSTVARS, batch_size=2)["serial"] == [4, 4]
    assert rollout.plan(GROUPS, HOSTVARS, batch_size=0)["serial"] == [8]
    assert rollout.plan(GROUPS, dict(HOSTVARS, **{"gpu-a": {"kpro_rollout_serial": 2, "kpro_rollout_max_fail_percentage": 50}}))[
        "max_fail_percentage"] == 50
    with pytest.raises(ValueError):
        rollout.plan(GROUPS, HOSTVARS, batch_size=-1)


def test_the_single_host_inventory_is_one_batch_as_before():
    p = rollout.plan({"proxmox_hosts": ["kpro5"], "gpu_containers": ["ct129"]}, {"kpro5": {}, "ct129": {"pve_node_host": "kpro5"}})
    assert p["hosts"] == ["kpro5", "ct129"] and p["serial"] == [2]


def test_serial_and_policy_come_back_from_the_groups_the_plan_play_makes():
    groups = {"kpro_rollout_batch_0001": ["gpu-b", "ct202"], "kpro_rollout_batch_0000": ["gpu-a", "ct201"],
              "kpro_rollout_batch_0002": ["gpu-c", "ct301", "gpu-d", "ct302"], "kpro_rollout_max_fail_25": ["gpu-a"]}
    assert rollout.serial_from_groups(groups) == [2, 2, 4]
    assert rollout.max_fail_from_groups(groups) == 25 and rollout.max_fail_from_groups({}) == 0
    assert rollout.enumerate_batches([["a", "c"], ["b"]]) == [[0, "a"], [0, "c"], [1, "b"]]


def test_status_shows_every_unit():
    hv = dict(HOSTVARS)
    hv["gpu-a"] = {"kpro_rollout_result": "served"}
    hv["ct201"] = dict(HOSTVARS["ct201"], kpro_rollout_result="served")
    hv["gpu-b"] = {"kpro_rollout_result": "served"}
    hv["ct202"] = dict(HOSTVARS["ct202"], kpro_rollout_result="failed",
                       kpro_rollout_failure={"task": "Gate the launch until it really serves", "phase": "peer_missing"})
    lines = rollout.status(rollout.units(GROUPS["proxmox_hosts"], GROUPS["gpu_containers"], HOSTVARS), hv)
    assert lines[0] == "gpu-a + ct201: serving"
    assert lines[1].startswith("gpu-b + ct202: FAILED on ct202 at 'Gate the launch") and "(peer_missing)" in lines[1]
    assert lines[2].endswith("not touched (the rollout stopped before it)")


def test_the_nodes_of_a_server_must_agree():
    assert rollout.plan(GROUPS, HOSTVARS)["problems"] == []
    hv = dict(HOSTVARS, ct302={"pve_node_host": "gpu-d", "sglang_server_options": dict(TWO, node_rank=0)})
    problems = rollout.plan(GROUPS, hv)["problems"]
    assert problems and problems[0].startswith("the multi-node server at 192.0.2.31:20000: node ranks [0, 0]")


def test_the_nodes_agree_on_the_options_they_run_with():
    """The raw inventory options agree (no tp_size in them); the options each node runs with (the role's merge, the fact
    sglang_server_run_options) do not: TP 4 on one node, 2 on the other. Refused, naming both."""
    raw = dict(TWO)
    del raw["tp_size"]
    hv = dict(HOSTVARS)
    for name, rank, tp in (("ct301", 0, 4), ("ct302", 1, 2)):
        hv[name] = {"pve_node_host": HOSTVARS[name]["pve_node_host"], "sglang_server_options": dict(raw, node_rank=rank)}
    assert rollout.plan(GROUPS, hv)["problems"] == []       # without the fact: the inventory's options as they are
    for name, rank, tp in (("ct301", 0, 4), ("ct302", 1, 2)):
        hv[name] = dict(hv[name], sglang_server_run_options=dict(raw, node_rank=rank, tp_size=tp, model_path="/srv/m"))
    assert rollout.plan(GROUPS, hv)["problems"] == [
        "the multi-node server at 192.0.2.31:20000: tp_size differs between the nodes (ct301=4, ct302=2); it must be the same on "
        "every node"]
    # the units follow the options the nodes run with too: the merged nnodes / dist_init_addr group them
    assert rollout.units(GROUPS["proxmox_hosts"], GROUPS["gpu_containers"], hv)[2] == ["gpu-c", "ct301", "gpu-d", "ct302"]


def test_plan_under_a_limit_plans_only_the_named_units():
    p = rollout.plan(GROUPS, HOSTVARS, play_hosts=["gpu-b", "ct202"])
    assert p["units"] == [["gpu-b", "ct202"]] and p["serial"] == [2] and p["problems"] == []
    p = rollout.plan(GROUPS, HOSTVARS, batch_size=2, play_hosts=["gpu-a", "ct201", "gpu-c", "ct301", "gpu-d", "ct302"])
    assert p["batches"] == [["gpu-a", "ct201", "gpu-c", "ct301", "gpu-d", "ct302"]] and p["serial"] == [6]
    assert rollout.plan(GROUPS, HOSTVARS, play_hosts=list(HOSTVARS))["hosts"] == rollout.plan(GROUPS, HOSTVARS)["hosts"]


def test_plan_under_a_limit_refuses_part_of_a_unit():
    p = rollout.plan(GROUPS, HOSTVARS, play_hosts=["gpu-b"])
    assert p["hosts"] == [] and len(p["problems"]) == 1
    assert p["problems"][0].startswith("--limit names part of the rollout unit gpu-b + ct202: name all of it (add ct202)")
    p = rollout.plan(GROUPS, HOSTVARS, play_hosts=["gpu-c", "ct301", "ct202"])       # half a multi-node server
    assert [m.split(":")[0] for m in p["problems"]] == ["--limit names part of the rollout unit gpu-b + ct202",
                                                        "--limit names part of the rollout unit gpu-c + ct301 + gpu-d + ct302"]
    assert "(add gpu-d:ct302)" in p["problems"][1]
