"""The preloaded vLLM (tests/e2e/vllm_preload.py) runs a script as ``python -c`` would, and each job from a clean state.

The differential and introspection tests trust it with their verdicts: a failing script must fail their run (exit
status and traceback come back), a job must see its own argv, stdin and environment, and nothing one job changes (vLLM's
logging, the environment, a module's state) may reach the next job, which is what running each in its own process gave.
"""
import os
import textwrap

import pytest

pytestmark = pytest.mark.e2e

PROBE = textwrap.dedent('''
    import json, logging, os, sys
    import vllm.envs
    from vllm.config.speculative import SpeculativeConfig
    print(json.dumps({"argv": sys.argv, "stdin": sys.stdin.read(), "level": os.environ.get("VLLM_LOGGING_LEVEL"),
                      "envs_level": vllm.envs.VLLM_LOGGING_LEVEL, "marker": os.environ.get("PRELOAD_MARKER"),
                      "disabled": logging.root.manager.disable, "touched": getattr(SpeculativeConfig, "_preload_probe", None),
                      "name": __name__, "pid": os.getpid()}))
    # leave state behind: the next job must not see any of it
    os.environ["PRELOAD_MARKER"] = "left by the job before"
    SpeculativeConfig._preload_probe = "left by the job before"
    logging.disable(logging.CRITICAL)
''')


def test_a_failing_script_fails_with_its_status_and_traceback(vllm_preloaded):
    raised = vllm_preloaded.run("import vllm\nraise ValueError('probe failure')")
    assert raised.returncode == 1 and "ValueError: probe failure" in raised.stderr, raised
    exited = vllm_preloaded.run("import sys\nprint('before exit', flush=True)\nsys.exit(3)")
    assert exited.returncode == 3 and exited.stdout == "before exit\n", exited
    assert vllm_preloaded.run("pass").returncode == 0


def test_each_job_sees_its_argv_stdin_and_environment_and_nothing_of_the_job_before(vllm_preloaded):
    import json  # pylint: disable=import-outside-toplevel
    seen = []
    for level in ("INFO", "ERROR"):
        run = vllm_preloaded.run(PROBE, ["one", "two"], input="the job's stdin %s" % level,
                                 env=dict(os.environ, VLLM_LOGGING_LEVEL=level), timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        seen.append(json.loads(run.stdout.strip().splitlines()[-1]))
    for level, job in zip(("INFO", "ERROR"), seen):
        assert job["argv"] == ["-c", "one", "two"] and job["name"] == "__main__", job
        assert job["stdin"] == "the job's stdin %s" % level, job
        assert job["level"] == job["envs_level"] == level, job  # vllm.envs reads the job's environment
        assert job["marker"] is None and job["touched"] is None and job["disabled"] == 0, job  # nothing from the job before
    assert seen[0]["pid"] != seen[1]["pid"] != os.getpid()
    assert vllm_preloaded.threads == 1 and vllm_preloaded.import_seconds > 0
