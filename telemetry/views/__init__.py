"""HTML pages of telemetry: the heatmaps and the agents' health."""
