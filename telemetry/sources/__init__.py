"""Parsers that turn what other tools print (nvidia-smi XML, dcgm-exporter text) into a
`telemetry.payload.Report`, the same shape the host agent's payload is validated into."""
