"""Right-sizing suggestions and density plans are built on telemetry rollups (see DESIGN.md)."""
