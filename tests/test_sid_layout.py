"""SID token layout: blocks are contiguous, disjoint and stable; codes round-trip."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.sids.layout import SPECIAL_TOKENS, Catalog, SidLayout, add_dedup_digit


def test_layout_blocks():
    lay = SidLayout(base_vocab_size=100, item_codebooks=(4, 3), dedup_size=2, user_codebooks=(5,))
    names = lay.token_names()
    assert len(names) == lay.num_new_tokens == 4 + 3 + 2 + 5 + len(SPECIAL_TOKENS)
    assert names[:5] == ["<a_0>", "<a_1>", "<a_2>", "<a_3>", "<b_0>"]
    assert lay.item_level_offset(2) == 107 and names[7] == "<c_0>"  # dedup block
    assert lay.user_level_offset(0) == 109 and names[9] == "<ua_0>"
    assert lay.placeholder_id == 114 and names[14] == "<|user|>"
    ids = lay.item_codes_to_ids(np.array([[3, 2, 1]]))
    assert ids.tolist() == [[103, 106, 108]]
    assert lay.item_ids_to_codes(ids).tolist() == [[3, 2, 1]]
    assert SidLayout.from_dict(lay.to_dict()) == lay
    with pytest.raises(ValueError, match="out of range"):
        lay.item_codes_to_ids(np.array([[4, 0, 0]]))


def test_dedup_and_catalog():
    codes = np.array([[0, 1], [0, 1], [2, 2], [0, 1]])
    full = add_dedup_digit(codes)
    assert full[:, -1].tolist() == [0, 1, 0, 2]
    lay = SidLayout(10, (3, 3), dedup_size=3)
    cat = Catalog(full, lay)
    for i in range(4):
        assert cat.item_of(cat.sid_tokens(i)) == i
    assert cat.item_of([0, 0, 0]) is None
    assert cat.sid_string(1) == "<a_0><b_1><c_1>"
    with pytest.raises(ValueError, match="not unique"):
        Catalog(np.array([[0, 1, 0], [0, 1, 0]]), lay)
