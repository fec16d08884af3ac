# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter kpro.gpu_serving.model_sources (docs in model_sources.yml beside this one)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import model_peers


def model_sources(sources, hostvars, groups, inventory_hostname, bwlimit=0):
    """hf_model's sources: peers named by inventory host or group resolved (module_utils/controller/model_peers.py)."""
    try:
        return model_peers.resolve(sources, hostvars, groups, inventory_hostname, bwlimit)
    except (TypeError, ValueError) as e:
        raise AnsibleFilterError("model_sources: %s" % e)


class FilterModule(object):
    def filters(self):
        return {"model_sources": model_sources}
