"""Plan JSON fixtures shared by tests: a two-group schema-2 plan of llama2-7b on three-vendor-20
(docs/architecture.md §Plan JSON, schema 2)."""

from __future__ import annotations

GROUPED = {"schema": 2, "model": "llama2-7b", "cluster": "three-vendor-20", "global_batch": 128, "seq_len": 4096,
           "groups": [{"dp": 1, "micro_batch": 2, "micro_batches": 24,
                       "stages": [{"gpu": "a100-80g", "tp": 4, "layers": 32}]},
                      {"dp": 2, "micro_batch": 1, "micro_batches": 40,
                       "stages": [{"gpu": "vendor-b-32g", "tp": 4, "layers": 16, "recompute": "selective"},
                                  {"gpu": "vendor-c-32g", "tp": 4, "layers": 16, "recompute": "full"}]}]}
