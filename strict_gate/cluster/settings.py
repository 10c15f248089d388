"""An arm's `[<role>.ray]` table: where the cluster is and what each actor asks of it.

```toml
[candidate.ray]
address = "ray://head:10001"   # default: $RAY_ADDRESS, else "auto" (a cluster started with `ray start`)
actors = 4                     # engines, one per actor, each serving one prompt at a time
num_cpus = 1                   # per actor, as Ray schedules it
num_gpus = 1
resources = { accel = 1 }      # custom resources a node advertises (`ray start --resources`)
retries = 2                    # times one prompt may be sent again after its actor died
[candidate.ray.env]            # per-actor environment, beside the arm's own [candidate.env]
CUDA_MODULE_LOADING = "LAZY"
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

from strict_gate.core.options import Bound, Checked, NonNegativeInt, PositiveInt

NonNegativeFloat = Annotated[float, Bound(ge=0)]


@dataclass(frozen=True)
class RaySettings(Checked):
    address: str | None = None
    actors: PositiveInt = 1
    num_cpus: NonNegativeFloat = 1.0
    num_gpus: NonNegativeFloat = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    retries: NonNegativeInt = 2
    start_timeout_s: Annotated[float, Bound(gt=0)] = 600.0
    env: dict[str, str] = field(default_factory=dict)

    def cluster(self) -> str:
        """The address ray.init is given: the table's, else RAY_ADDRESS, else a local cluster's."""
        return self.address or os.environ.get("RAY_ADDRESS") or "auto"
