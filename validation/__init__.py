"""Validation: simulator predictions against GPU measurements of the same trace and config.

`python -m validation compare --gpu-dir DIR --out REPORT` simulates every GPU replay folder's
configuration and writes report.md, report.json and PNG plots; see validation/README.md.
"""
