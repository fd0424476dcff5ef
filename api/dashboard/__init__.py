"""Server-rendered dashboard (Jinja2 + inline SVG): sweeps overview, sweep page, experiment page."""
