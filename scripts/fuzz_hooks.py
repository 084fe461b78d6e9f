"""Schemathesis hooks for scripts/api-fuzz.

Each generated submission whose Idempotency-Key is valid gets a fresh random key: schemathesis
reuses its generated keys across different bodies, which the API rightly refuses with
422 idempotency_key_reused (draft-ietf-httpapi-idempotency-key-header). Replay and reuse
semantics are covered by the integration tests; the fuzzer explores everything else.
"""
import uuid

import schemathesis


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and 1 <= len(key) <= 255:
        # A new dict: never mutate headers a check may share with another case.
        case.headers = {**case.headers, "Idempotency-Key": str(uuid.uuid4())}
