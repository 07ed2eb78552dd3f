"""The worker: claims trial batches, runs them in the digest-pinned runner, grades, exports."""
