"""Hooks for the contract fuzzer (`.ci/contract`): callbacks signed as the aggregator signs them.

The aggregator signs the exact bytes of a callback's body and sends the signature in the
`X-Signature` header (the OpenAPI document's `aggregatorSignature` security scheme). This
auth provider signs each generated callback with the Ed25519 key in `PAYHOOK_CONTRACT_KEY`,
over the bytes schemathesis then sends: `requests` serialises a JSON body with
`json.dumps(body, allow_nan=False)`, UTF-8. Schemathesis treats it as explicit auth, so its
`ignored_auth` check still removes it and forges it, expecting 401.
"""

import base64
import decimal
import json
import os
import re

import schemathesis
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from schemathesis.core import NOT_SET

with open(os.environ["PAYHOOK_CONTRACT_KEY"], "rb") as pem:
    KEY = load_pem_private_key(pem.read(), password=None)


def body_bytes(case) -> bytes:
    """The bytes `requests` will send for the case's body."""
    body = case.body
    if body is NOT_SET:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str) and case.media_type not in (None, "application/json"):
        return body.encode()
    return json.dumps(body, allow_nan=False).encode("utf-8")


@schemathesis.auth(refresh_interval=None, retry_on=[]).apply_to(path="/payhook/callback")
class AggregatorSignature:
    def get(self, case, context):
        try:
            data = body_bytes(case)
        except ValueError:
            # NaN or infinity: `requests` refuses to send it, so there is nothing to sign.
            return None
        return base64.b64encode(KEY.sign(data)).decode("ascii")

    def set(self, case, data, context):
        case.headers = case.headers or {}
        case.headers["X-Signature"] = data


# What JSON Schema cannot say about amounts: they must fit a 96-bit decimal exactly (at most
# 28 fractional digits, counting an exponent, and a mantissa below 2^96). The document says
# it in words, and the server answers 400 otherwise; data generated to fit the document is
# kept to amounts that fit, so that "schema-valid" means valid. Data that breaks the
# document's own rules (types, signs, bounds, patterns) is left alone for negative testing.
AMOUNTS = ("amount", "destinationAmount")
MAX_SCALE = 28
MANTISSA_LIMIT = 2**96


def fits_a_decimal(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return True  # not an amount's type: the document's own rules decide
    text = json.dumps(value) if not isinstance(value, str) else value
    numeric = re.fullmatch(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?", text) is not None
    if not numeric:
        return True  # not the numeric syntax: the document's pattern decides
    try:
        number = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return False  # numeric, but an exponent beyond any decimal's range
    if not number.is_finite():
        return True
    sign, digits, exponent = number.as_tuple()
    mantissa = int("".join(map(str, digits)) or "0")
    if exponent < 0:
        return -exponent <= MAX_SCALE and mantissa < MANTISSA_LIMIT
    return mantissa * 10**min(exponent, 40) < MANTISSA_LIMIT


def amounts_fit(value) -> bool:
    if isinstance(value, dict):
        return all(
            (fits_a_decimal(inner) if key in AMOUNTS else True) and amounts_fit(inner)
            for key, inner in value.items()
        )
    if isinstance(value, list):
        return all(amounts_fit(inner) for inner in value)
    return True


@schemathesis.hook
def filter_body(context, body):
    return amounts_fit(body)
