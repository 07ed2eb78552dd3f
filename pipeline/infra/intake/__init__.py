"""Intake: a dispatch payload checked against the schema and the operator's policy, then enqueued."""
