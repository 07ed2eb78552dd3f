"""The run queue: SQLite on one host (sql.py), PostgreSQL when workers span hosts (postgres.py)."""
