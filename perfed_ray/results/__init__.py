"""Parquet result tables and their schema."""
