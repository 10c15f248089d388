"""The judgement of two runs: comparison, policy, teacher-forced diagnosis, drift, the gate result."""
