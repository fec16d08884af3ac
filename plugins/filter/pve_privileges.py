# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters kpro.gpu_serving.pve_token_permission_terms and pve_token_privileges (docs in the .yml files beside this
one): the preflight's check of the API token's privileges (module_utils/controller/pve_privileges.py)."""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import pve_privileges


def pve_token_permission_terms(vmids):
    """The pve_api lookup's terms: GET /access/permissions?path=... for each path the run uses, then /."""
    return pve_privileges.terms(list(vmids or []))


def pve_token_privileges(answers, vmids, tokenid):
    """dict(problems, full_rights) from the lookup's answers to those terms."""
    return pve_privileges.check(list(answers or []), list(vmids or []), str(tokenid))


class FilterModule(object):
    def filters(self):
        return {"pve_token_permission_terms": pve_token_permission_terms, "pve_token_privileges": pve_token_privileges}
