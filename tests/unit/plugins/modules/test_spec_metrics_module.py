"""The speculative_metrics_info module through real ansible-playbook: a loopback HTTP server serves the captured /metrics pages."""

import http.server
import threading

import pytest

from tests.ansible_run import run_playbook as _run_playbook

from tests.paths import CAPTURES, read_capture  # noqa: E402  pylint: disable=wrong-import-position


def run_playbook(tmp_path, tasks, check=False):
    """(rc, per-task results, raw output) of an ad-hoc play run by real ansible-playbook."""
    run = _run_playbook(tmp_path, tasks=tasks, check=check)
    assert run.tasks, "ansible-playbook ran no task:\n" + run.output
    return run.rc, [res for _name, _host, res in run.tasks], run.stdout


def read(folder, name):
    return read_capture(folder, name)


@pytest.fixture
def metrics_server():
    """Serves a sequence of /metrics pages (the last repeats); requires `Authorization: Bearer s3cret`."""
    state = {"pages": [], "hits": 0, "auth": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            state["auth"].append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != "Bearer s3cret":
                self.send_response(401)
                self.end_headers()
                return
            page = state["pages"][min(state["hits"], len(state["pages"]) - 1)]
            state["hits"] += 1
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = "http://127.0.0.1:%d/metrics" % server.server_address[1]
    yield state
    server.shutdown()
    server.server_close()


def test_url_with_bearer_token_and_diagnosis(tmp_path, metrics_server):
    metrics_server["pages"] = [read("eagle3", "metrics.txt")]
    rc, res, stdout = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_metrics_info:
            url: %s
            bearer_token: s3cret
            method: eagle3
            model_name: t-eagle3
        """ % metrics_server["url"])
    assert rc == 0, res
    r = res[0]
    assert r["source"] == "prometheus" and r["has_data"] is True and r["changed"] is False
    # eagle3/metrics.txt: drafts 1026, draft tokens 3078, accepted 0
    assert (r["num_drafts"], r["num_draft_tokens"], r["num_accepted_tokens"]) == (1026, 3078, 0)
    assert r["accepted_tokens_per_position"] == [0, 0, 0]
    assert r["mean_acceptance_length"] == 1.0 and r["draft_acceptance_rate"] == 0.0
    assert r["diagnosis"]["status"] == "likely_draft_mismatch"
    assert metrics_server["auth"] == ["Bearer s3cret"]
    assert "s3cret" not in stdout


def test_interval_reports_the_window(tmp_path, metrics_server):
    # two scrapes of the same ngram server: after 3 of the 6 requests (metrics_partial.txt) and after all (metrics.txt)
    metrics_server["pages"] = [read("ngram", "metrics_partial.txt"), read("ngram", "metrics.txt")]
    rc, res, _out = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_metrics_info:
            url: %s
            headers: {Authorization: Bearer s3cret}
            interval: 0.5
        """ % metrics_server["url"])
    assert rc == 0, res
    r = res[0]
    # 229-122 drafts, 1002-552 draft tokens, 655-296 accepted, per position 190-95 152-72 126-57 99-39 88-33
    assert (r["num_drafts"], r["num_draft_tokens"], r["num_accepted_tokens"]) == (107, 450, 359)
    assert r["accepted_tokens_per_position"] == [95, 80, 69, 60, 55]
    assert r["interval"] == 0.5 and metrics_server["hits"] == 2


def test_thresholds_fail_and_no_data_does_not(tmp_path):
    rc, res, _out = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_metrics_info:
            metrics_path: %(c)s/baseline/metrics.txt
        - alauda.spec_decoding.speculative_metrics_info:
            metrics_path: %(c)s/ngram/metrics.txt
            min_mean_acceptance_length: 2.0
            min_acceptance_rate: 0.7
        """ % {"c": CAPTURES})
    assert res[0]["has_data"] is False and res[0]["diagnosis"]["status"] == "no_data" and not res[0].get("failed")
    assert rc != 0 and res[1]["failed"] is True
    # ngram/metrics.txt: 655 of 1002 draft tokens accepted; mean acceptance length 1 + 655/229 = 3.86 meets 2.0
    assert res[1]["failures"] == ["draft_acceptance_rate 0.6537 is below min_acceptance_rate 0.7"]


def test_log_fallback_and_windows(tmp_path):
    rc, res, _out = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_metrics_info:
            metrics_path: %(c)s/baseline/metrics.txt
            log_path: %(c)s/ngram/startup.log
            method: ngram
        """ % {"c": CAPTURES})
    assert rc == 0
    r = res[0]
    assert r["source"] == "log" and r["windows_total"] == 2 and len(r["windows"]) == 2
    # the two windows of ngram/startup.log: 103/206 and 552/796
    assert [(w["num_accepted_tokens"], w["num_draft_tokens"]) for w in r["windows"]] == [(103, 206), (552, 796)]
    assert (r["num_draft_tokens"], r["num_accepted_tokens"], r["num_drafts"]) == (1002, 655, 229)
    assert r["notes"] and "no spec_decode counters" in r["notes"][0]


def test_interval_needs_a_live_source(tmp_path):
    rc, res, _out = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_metrics_info:
            metrics_path: %s/ngram/metrics.txt
            interval: 5
        """ % CAPTURES)
    assert rc != 0 and res[0]["msg"].startswith("interval:")


def test_bad_port_is_refused_before_any_api_call(tmp_path):
    """A port the pod proxy cannot take fails with the field named, before the module builds an API client: the
    kubeconfig given does not exist, so reaching the cluster would fail differently."""
    rc, res, _out = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_metrics_info:
            name: llama
            namespace: models
            port: "70000"
            kubeconfig: %s/no-such-kubeconfig
        """ % tmp_path)
    assert rc != 0 and res[0]["field"] == "port", res[0]
    assert "port 70000 is out of range" in res[0]["msg"] and "kubeconfig" not in res[0]["msg"]
