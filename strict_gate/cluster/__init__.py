"""An arm's prompts served by a pool of Ray actors, one engine each (docs/scale-out.md, section 4):
`[candidate.ray]` (or any arm's) turns the arm's engine into a `RayExecuted` engine that the gate,
`strict-gate run` and the re-scoring drive as they drive any engine. Ray is an optional extra."""
