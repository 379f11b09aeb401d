"""Draw the sweep report's two plots (load, k) from a sweep JSON, as `spec_sweep` draws them, for the docs.

Usage: python hack/docs_plots.py SWEEP_JSON PREFIX
writes PREFIX-load.png and PREFIX-k.png. SWEEP_JSON is the JSON a `spec_sweep` run writes (`<report_dir>/<report_name>.json`,
kept by tests/e2e/test_tune_e2e.py in its work folder) or docs/when-it-pays/tune-sweep.json, the data of the plots in
docs/when-it-pays.md:

    python hack/docs_plots.py docs/when-it-pays/tune-sweep.json docs/when-it-pays/tune

Needs the collection importable (PYTHONPATH=.build/collections, as `make setup` links it) and matplotlib.
"""
from __future__ import annotations

import json
import sys

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import plots as bench_plots


def draw(sweep_json, prefix):
    """The plots `bench_report.write_sweep_report` draws, from the sweep JSON's ``result``; returns the paths written."""
    with open(sweep_json, encoding="utf-8") as handle:
        result = json.load(handle)["result"]
    kind = (result.get("break_even") or {}).get("kind") or result["points"][0]["kind"]
    paths = [bench_plots.plot_sweep_load([p for p in result["points"] if p["kind"] == kind], result.get("break_even"),
                                         (result.get("target") or {}).get("target_qps"), prefix + "-load.png", kind=kind)]
    k_block = result.get("k") or {}
    if k_block.get("prediction"):
        paths.append(bench_plots.plot_k_curve(k_block["prediction"], k_block.get("confirmation"), prefix + "-k.png"))
    return paths


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    for path in draw(argv[1], argv[2]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
