#!/usr/bin/env python3
"""An external signer for the tests (docs/signing.md, "External signers"):
it answers the imager-signer-1 protocol with the key file named by
$TEST_SIGNER_KEY, signing through the openssl command, as a script around
a KMS's own command-line tool would. It records each request's op in
$TEST_SIGNER_LOG (one line each), so the test sees it was asked."""
import base64
import json
import os
import subprocess
import sys
import tempfile


def answer(obj, code=0):
    sys.stdout.write(json.dumps(obj))
    sys.exit(code)


req = json.load(sys.stdin)
if req.get("protocol") != "imager-signer-1":
    answer({"error": "unknown protocol"}, 2)
key = os.environ["TEST_SIGNER_KEY"]
with open(os.environ["TEST_SIGNER_LOG"], "a") as log:
    log.write(req.get("op", "?") + "\n")
if req["op"] == "public-key":
    der = subprocess.run(
        ["openssl", "pkey", "-in", key, "-pubout", "-outform", "DER"],
        check=True, capture_output=True).stdout
    answer({"public_key": base64.b64encode(der).decode()})
if req["op"] == "sign" and req.get("algorithm") == "ed25519":
    with tempfile.NamedTemporaryFile() as msg:
        msg.write(base64.b64decode(req["message"]))
        msg.flush()
        sig = subprocess.run(
            ["openssl", "pkeyutl", "-sign", "-rawin", "-inkey", key, "-in", msg.name],
            check=True, capture_output=True).stdout
    answer({"signature": base64.b64encode(sig).decode()})
if req["op"] == "sign" and req.get("algorithm") == "rsa-pkcs1-sha256":
    with tempfile.NamedTemporaryFile() as msg:
        msg.write(base64.b64decode(req["message"]))
        msg.flush()
        sig = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", key, msg.name],
            check=True, capture_output=True).stdout
    answer({"signature": base64.b64encode(sig).decode()})
answer({"error": "unsupported request"}, 2)
