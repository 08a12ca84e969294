"""Integrations with the tools operators already run, each behind its extra:
`trioexec.contrib.prometheus` (``prometheus``) and `trioexec.contrib.otel` (``otel``)."""
