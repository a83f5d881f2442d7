"""Performance reports: tables, plots and a page made from results files (never by running models).

``harness report ...`` (``harness/report_cmd.py``) measures and writes results files under
``reports/out/<report>/``; this package reads them back: ``reports.page.render_report(dir)`` writes a
report's Markdown and PNGs, ``reports.page.render_index(root)`` the page ``index.md``/``index.html``.
"""
