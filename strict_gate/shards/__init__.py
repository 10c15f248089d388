"""Static shards of a prompt set for schedulers without Ray (Kubernetes indexed jobs, Slurm
arrays): `strict-gate run ... --shard I/N` writes one shard's run, `strict-gate merge` joins
N shards into one run that gates as `kind = "recorded"` (docs/scale-out.md)."""
