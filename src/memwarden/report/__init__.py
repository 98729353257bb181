"""Rendering: terminal tables, the self-contained HTML report, the allocator heatmap. No torch."""
