"""Artifact credentials: Secret/ServiceAccount manifests as KServe reads them, GitOps placeholders, redaction."""
from __future__ import annotations

import base64
import json

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import credentials as c
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

CANARY_HF = "hf_CanaryTokenValue0123456789abcdef"
CANARY_S3 = "s3CanarySecretKeyValue/+abc987"
CANARY_REG = "regCanaryPassw0rd!xyz"


def settings(**extra):
    base = {"namespace": "models", "service_account_name": "llm-artifacts", "hf_token": CANARY_HF,
            "s3": {"access_key_id": "AKIACANARYID", "secret_access_key": CANARY_S3, "endpoint": "https://minio.storage:9000",
                   "use_https": False, "region": "us-east-2", "verify_ssl": "false"},
            "registries": [{"server": "https://registry.internal.example:5000/v2/", "username": "robot", "password": CANARY_REG}]}
    base.update(extra)
    return base


def decode(secret, key):
    return base64.b64decode(secret["data"][key]).decode()


def test_cluster_plan_secrets_and_service_account():
    plan = c.build_cluster_plan(settings())
    by_name = {s["metadata"]["name"]: s for s in plan["secrets"]}
    assert sorted(by_name) == ["llm-artifacts-hf", "llm-artifacts-registry", "llm-artifacts-s3"]
    assert decode(by_name["llm-artifacts-hf"], "HF_TOKEN") == CANARY_HF
    s3 = by_name["llm-artifacts-s3"]
    assert decode(s3, "AWS_ACCESS_KEY_ID") == "AKIACANARYID" and decode(s3, "AWS_SECRET_ACCESS_KEY") == CANARY_S3
    assert s3["metadata"]["annotations"] == {"serving.kserve.io/s3-endpoint": "minio.storage:9000",
                                             "serving.kserve.io/s3-usehttps": "0", "serving.kserve.io/s3-region": "us-east-2",
                                             "serving.kserve.io/s3-verifyssl": "0"}
    reg = by_name["llm-artifacts-registry"]
    assert reg["type"] == "kubernetes.io/dockerconfigjson"
    auths = json.loads(decode(reg, ".dockerconfigjson"))["auths"]
    assert list(auths) == ["registry.internal.example:5000"]
    assert base64.b64decode(auths["registry.internal.example:5000"]["auth"]).decode() == "robot:" + CANARY_REG
    sa = plan["service_account"]
    assert sa["metadata"] == {"name": "llm-artifacts", "namespace": "models",
                              "labels": {"app.kubernetes.io/managed-by": "alauda.spec_decoding",
                                         "app.kubernetes.io/component": "artifact-credentials"}}
    assert sa["secrets"] == [{"name": "llm-artifacts-hf"}, {"name": "llm-artifacts-s3"}]
    assert sa["imagePullSecrets"] == [{"name": "llm-artifacts-registry"}]
    assert set(plan["secret_values"]) >= {CANARY_HF, CANARY_S3, CANARY_REG}


def test_only_what_is_given_and_existing_references():
    plan = c.build_cluster_plan({"namespace": "m", "service_account_name": "sa", "existing_secrets": ["vault-hf"],
                                 "existing_pull_secrets": ["quay-pull"]})
    assert plan["secrets"] == []
    assert plan["service_account"]["secrets"] == [{"name": "vault-hf"}]
    assert plan["service_account"]["imagePullSecrets"] == [{"name": "quay-pull"}]


def test_custom_key_names_and_anonymous_bucket():
    plan = c.build_cluster_plan({"namespace": "m", "service_account_name": "sa",
                                 "s3": {"access_key_id": "id1", "secret_access_key": "key12345", "access_key_id_name": "awsAccessKeyID",
                                        "secret_access_key_name": "awsSecretAccessKey"}})
    assert sorted(plan["secrets"][0]["data"]) == ["awsAccessKeyID", "awsSecretAccessKey"]
    anon = c.build_cluster_plan({"namespace": "m", "service_account_name": "sa",
                                 "s3": {"use_anonymous_credential": True, "endpoint": "s3.example"}})
    assert anon["secrets"][0]["data"] == {}
    assert anon["secrets"][0]["metadata"]["annotations"]["serving.kserve.io/s3-useanoncredential"] == "true"


@pytest.mark.parametrize("bad, field", [
    ({"namespace": "Models"}, "namespace"),
    ({"service_account_name": "a_b"}, "service_account_name"),
    ({"s3": {"access_key_id": "x"}}, "s3"),
    ({"registries": [{"server": "r.example", "username": "u"}]}, "registries[0]"),
    ({"s3": {"access_key_id": "a", "secret_access_key": "b", "use_https": "maybe"}}, "s3.use_https"),
    ({"gitops_style": "vault"}, "gitops_style"),
])
def test_validation_names_the_field(bad, field):
    with pytest.raises(ValidationError) as err:
        c.build_cluster_plan(dict(settings(), **bad))
    assert err.value.field == field
    assert CANARY_HF not in str(err.value) and CANARY_REG not in str(err.value)


@pytest.mark.parametrize("style", ["external_secret", "sealed_secret", "reference"])
def test_gitops_never_carries_values(style):
    plan = c.build_gitops_plan(settings(gitops_style=style))
    text = plan["yaml"] + json.dumps(plan["manifests"]) + json.dumps(plan["notes"])
    for value in (CANARY_HF, CANARY_S3, CANARY_REG, "AKIACANARYID", base64.b64encode(CANARY_HF.encode()).decode()):
        assert value not in text
    docs = [d for d in yaml.safe_load_all(plan["yaml"]) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "ServiceAccount"
    assert docs[0]["secrets"] == [{"name": "llm-artifacts-hf"}, {"name": "llm-artifacts-s3"}]
    assert docs[0]["imagePullSecrets"] == [{"name": "llm-artifacts-registry"}]
    if style == "external_secret":
        assert kinds[1:] == ["ExternalSecret"] * 3
        reg = [d for d in docs if d["metadata"]["name"] == "llm-artifacts-registry"][0]
        assert reg["spec"]["target"]["template"]["type"] == "kubernetes.io/dockerconfigjson"
        assert reg["spec"]["data"] == [{"secretKey": ".dockerconfigjson",
                                        "remoteRef": {"key": "models/llm-artifacts-registry", "property": ".dockerconfigjson"}}]
        s3 = [d for d in docs if d["metadata"]["name"] == "llm-artifacts-s3"][0]
        assert s3["spec"]["target"]["template"]["metadata"]["annotations"]["serving.kserve.io/s3-endpoint"] == "minio.storage:9000"
    elif style == "sealed_secret":
        assert kinds[1:] == ["SealedSecret"] * 3
        hf = [d for d in docs if d["metadata"]["name"] == "llm-artifacts-hf"][0]
        assert hf["spec"]["encryptedData"] == {"HF_TOKEN": c.SEALED_PLACEHOLDER}
    else:
        assert kinds == ["ServiceAccount"]
        assert any("models/llm-artifacts-hf" in n and "HF_TOKEN" in n for n in plan["notes"])


def test_gitops_without_values_from_declared_sources():
    plan = c.build_gitops_plan({"namespace": "m", "service_account_name": "sa", "hf_enabled": True, "registry_enabled": True})
    assert [m["kind"] for m in plan["manifests"]] == ["ServiceAccount", "ExternalSecret", "ExternalSecret"]
    assert plan["secret_names"] == ["sa-hf"] and plan["pull_secret_names"] == ["sa-registry"]


def test_redact_values_base64_and_token_arguments():
    text = ("HF_TOKEN=%s --hf-token %s --api-key=abcd1234 Authorization: Bearer zzzzyyyy auth=%s "
            "--tokenizer /mnt/models --max-num-batched-tokens 8192 num_spec_tokens=3 https://robot:%s@reg.example/v2"
            % (CANARY_HF, "othertoken99", base64.b64encode(CANARY_REG.encode()).decode(), CANARY_REG))
    out = c.redact(text, [CANARY_HF, CANARY_REG])
    for value in (CANARY_HF, CANARY_REG, "othertoken99", "abcd1234", "zzzzyyyy", base64.b64encode(CANARY_REG.encode()).decode()):
        assert value not in out
    assert "--tokenizer /mnt/models" in out and "--max-num-batched-tokens 8192" in out and "num_spec_tokens=3" in out


def test_redact_obj_pod_spec():
    pod = {"kind": "Pod", "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"x\": 1}"}},
           "spec": {"containers": [{"name": "kserve-container",
                                    "args": ["--model", "/mnt/models", "--hf-token", "tok-abc-123", "--speculative-config",
                                             '{"method":"ngram","num_speculative_tokens":5}'],
                                    "env": [{"name": "HF_TOKEN", "value": "plain-token-value"}, {"name": "MODEL", "value": "/mnt/models"},
                                            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}}
    out = c.redact_obj(pod)
    cont = out["spec"]["containers"][0]
    assert cont["args"][3] == c.REDACTED and cont["args"][5] == '{"method":"ngram","num_speculative_tokens":5}'
    assert cont["env"][0]["value"] == c.REDACTED and cont["env"][1]["value"] == "/mnt/models"
    assert cont["env"][2]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] == c.REDACTED
    secret = c.redact_obj({"kind": "Secret", "data": {"HF_TOKEN": "aGZf"}})
    assert secret["data"] == {"HF_TOKEN": c.REDACTED}


def test_is_secret_name():
    assert c.is_secret_name("--hf-token") and c.is_secret_name("AWS_SECRET_ACCESS_KEY") and c.is_secret_name("--api-key")
    assert not c.is_secret_name("--tokenizer") and not c.is_secret_name("--num-speculative-tokens")
    assert not c.is_secret_name("AWS_ACCESS_KEY_ID") and not c.is_secret_name("MAX_TOKENS")
