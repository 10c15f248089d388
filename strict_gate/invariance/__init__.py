"""The invariance variants: tokens must not depend on batch, concurrency, chunked prefill or the prefix cache."""
