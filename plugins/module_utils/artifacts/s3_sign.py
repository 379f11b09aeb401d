# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""AWS Signature Version 4 for the preflight's S3 GETs (a header-signed request with an empty payload), so a private
bucket is read with the access key the artifact_credentials role stores for KServe (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY, artifacts/credentials.py) rather than anonymously.

The algorithm is AWS's "Authenticating Requests: Using the Authorization Header (AWS Signature Version 4)" for S3:
canonical request (method, URI with each segment percent-encoded once, sorted query, lower-cased sorted headers, signed
header list, payload hash), string to sign, key derived from the secret by HMAC over date, region, service and
"aws4_request". tests/unit/test_draft_preflight_reads.py checks it against AWS's published GET Object example.

Plain Python, stdlib only; no Ansible imports. The secret never leaves this function: only the signature does.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key, text):
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def _canonical_query(query):
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return "&".join("%s=%s" % (urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~")) for k, v in sorted(pairs))


def sign_get(url, access_key_id, secret_access_key, region="us-east-1", headers=None, now=None, service="s3"):
    """The headers to send with a GET of ``url`` (``headers`` plus Host, x-amz-date, x-amz-content-sha256 and
    Authorization), every header given signed."""
    split = urllib.parse.urlsplit(url)
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    out = dict(headers or {})
    out.update({"Host": split.netloc, "x-amz-date": stamp, "x-amz-content-sha256": EMPTY_SHA256})
    canonical_headers = sorted((k.lower(), " ".join(str(v).split())) for k, v in out.items())
    signed = ";".join(k for k, _v in canonical_headers)
    # the path as sent, each segment encoded once (S3 does not double-encode)
    path = "/".join(urllib.parse.quote(urllib.parse.unquote(seg), safe="-_.~") for seg in (split.path or "/").split("/"))
    canonical = "\n".join(["GET", path, _canonical_query(split.query), "".join("%s:%s\n" % kv for kv in canonical_headers),
                           signed, EMPTY_SHA256])
    scope = "%s/%s/%s/aws4_request" % (day, region, service)
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret_access_key).encode("utf-8"), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    out["Authorization"] = "%s Credential=%s/%s,SignedHeaders=%s,Signature=%s" % (ALGORITHM, access_key_id, scope, signed, signature)
    return out
