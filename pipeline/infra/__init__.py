"""Benchmark infra: payload acceptance, the run queue + publication outbox, the worker.

Public entry points: ``accept.accept_payload``, ``queue.SqliteQueue`` (``queue.Queue``
interface), ``worker.run_once`` / ``worker.run_forever`` with ``worker.WorkerConfig``.
"""
