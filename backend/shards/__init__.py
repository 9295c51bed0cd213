"""WebDataset shards: pack many small files into deterministic, resumable tar shards and verify them."""
