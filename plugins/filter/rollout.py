# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters kpro.gpu_serving.rollout_plan, rollout_status, rollout_enumerate, rollout_serial, rollout_max_fail_percentage
(docs in the .yml files beside this one)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import rollout


def rollout_plan(groups, hostvars, batch_size=None, max_fail_percentage=None, play_hosts=None):
    """The rollout's host order, serial and max_fail_percentage (module_utils/controller/rollout.py plan())."""
    try:
        return rollout.plan(groups, hostvars, batch_size, max_fail_percentage, play_hosts)
    except (TypeError, ValueError) as e:
        raise AnsibleFilterError("rollout_plan: %s" % e)


def rollout_status(units, hostvars):
    """One line per rollout unit: serving, FAILED or not touched (module_utils/controller/rollout.py status())."""
    return rollout.status(units, hostvars)


def rollout_enumerate(batches):
    """[[batch index, host], ...] of the plan's batches."""
    return rollout.enumerate_batches(batches)


def rollout_serial(groups):
    """The rollout play's serial: the sizes of the batch groups the plan play made."""
    return rollout.serial_from_groups(groups)


def rollout_max_fail_percentage(groups):
    """The rollout play's max_fail_percentage, from the group the plan play made."""
    return rollout.max_fail_from_groups(groups)


class FilterModule(object):
    def filters(self):
        return {"rollout_plan": rollout_plan, "rollout_status": rollout_status, "rollout_enumerate": rollout_enumerate,
                "rollout_serial": rollout_serial, "rollout_max_fail_percentage": rollout_max_fail_percentage}
