"""Item and user Semantic IDs: text/ALS vectors -> residual quantizers -> SID layout, catalog and prefix trie."""
