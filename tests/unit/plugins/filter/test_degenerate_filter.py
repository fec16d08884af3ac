# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters kpro.gpu_serving.degenerate and degenerate_reason (module_utils/serve/degenerate.py) as a playbook uses them."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kpro.gpu_serving.plugins.filter import degenerate as flt


def test_the_filters_say_whether_and_why():
    filters = flt.FilterModule().filters()
    assert filters["degenerate"]("\n" * 10) is True and filters["degenerate_reason"]("\n" * 10) == "whitespace_only"
    # the 16-token salad of a broken TP 2 all-reduce (sglang#2354)
    salad = " Demp Schul.scalablytyped373\u044callis gutter\u307cdiaeftry Fallon572 Sransself"
    assert filters["degenerate"](salad) is True and filters["degenerate_reason"](salad) == "multilingual_salad"
    assert filters["degenerate"](" Paris.") is False and filters["degenerate_reason"](" Paris.") == ""


def test_a_non_string_is_refused():
    with pytest.raises(AnsibleFilterError, match="expects a string"):
        flt.degenerate(["a", "list"])
