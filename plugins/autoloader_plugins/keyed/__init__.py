"""Keyed long tables: SQLite and Parquet tables of one row per item, a key per event."""
