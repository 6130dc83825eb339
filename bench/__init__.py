"""The stallwatch benchmark as a package: `bench/run.py` (or `python3 -m bench`).

- `cli`: options, named sections, the run, `--json` and `--render`;
- `harness`: loop filesystems, the agent, node_exporter, HTTP clients, freezes,
  CPU/RSS sampling, and the undo stack that cleans up on every exit path;
- `sections/`: one module per section, each measuring and rendering its own tables;
- `results`: the dataclasses a run returns, and their JSON;
- `stats`, `tables`, `scrapecost`, `machine`: percentiles and formats, table
  rendering (text and Markdown), the shared scrape-cost measurement, the run's setting.

Method and current results: BENCHMARKS.md.
"""
