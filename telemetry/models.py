"""Agents, samples and rollups of GPU and vGPU metrics are collected here (see DESIGN.md)."""
