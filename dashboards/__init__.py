"""Grafana dashboards generated from code (see generate.py)."""
