"""headscope.reports: frames to figures, HTML, Markdown, tables and the command line."""
