"""gRPC's built-in xDS client, driven by the end-to-end tests over stdin/stdout.

GRPC_XDS_BOOTSTRAP must name the bootstrap file before the first xDS channel is created.
Each stdin line is a JSON command; each answer is one JSON line on stdout. Channels are
kept per target, so configuration changes reach an already-connected client.

Commands:
  {"cmd": "rpcs", "target": "xds:///host:port", "count": N, "metadata": {...}, "timeout_s": 5}
      -> {"counts": {backend name: n}, "errors": {status code name: n}, "details": [...]}
  {"cmd": "until", "target": ..., "expect": "name", "metadata": {...}, "max_s": 30}
      -> {"ok": true|false, "elapsed_ms": ms, "rpcs": n, "last": name-or-status}
  {"cmd": "quit"}

Optional in `rpcs` and `until`: "method" (default "/pilotfish.test.Echo/Who"; the answer
is counted by its text) and "creds": "insecure" (default: plaintext whatever the control
plane says) or "xds" (`grpc.xds_channel_credentials`: the TLS the cluster's
`transport_socket` configures, from the bootstrap's certificate providers; plaintext
where it configures none).
"""

import json
import sys
import time

import grpc
import grpc.experimental

METHOD = "/pilotfish.test.Echo/Who"
channels: dict = {}


def stub(c):
    target, creds = c["target"], c.get("creds", "insecure")
    key = (target, creds)
    if key not in channels:
        if creds == "xds":
            credentials = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
            channels[key] = grpc.secure_channel(target, credentials)
        else:
            channels[key] = grpc.insecure_channel(target)
    return channels[key].unary_unary(
        c.get("method", METHOD), request_serializer=None, response_deserializer=None
    )


def one_rpc(call, metadata, timeout_s):
    """Returns (backend name, None) or (None, status code name, details)."""
    try:
        reply = call(b"", metadata=metadata, timeout=timeout_s)
        return reply.decode(), None, None
    except grpc.RpcError as e:
        return None, e.code().name, e.details()


def cmd_rpcs(c):
    call = stub(c)
    metadata = tuple((k, v) for k, v in c.get("metadata", {}).items())
    counts, errors, details = {}, {}, []
    for _ in range(int(c["count"])):
        name, code, detail = one_rpc(call, metadata, float(c.get("timeout_s", 5)))
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
        else:
            errors[code] = errors.get(code, 0) + 1
            if len(details) < 5:
                details.append(f"{code}: {detail}")
    return {"counts": counts, "errors": errors, "details": details}


def cmd_until(c):
    call = stub(c)
    metadata = tuple((k, v) for k, v in c.get("metadata", {}).items())
    start = time.monotonic()
    deadline = start + float(c.get("max_s", 30))
    rpcs, last = 0, None
    while time.monotonic() < deadline:
        name, code, _ = one_rpc(call, metadata, 5)
        rpcs += 1
        last = name if name is not None else code
        if last == c["expect"]:
            return {"ok": True, "elapsed_ms": (time.monotonic() - start) * 1000, "rpcs": rpcs, "last": last}
        time.sleep(0.005)
    return {"ok": False, "elapsed_ms": (time.monotonic() - start) * 1000, "rpcs": rpcs, "last": last}


def main() -> None:
    print(json.dumps({"ready": True, "grpc": grpc.__version__}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        c = json.loads(line)
        if c["cmd"] == "quit":
            break
        try:
            answer = {"rpcs": cmd_rpcs, "until": cmd_until}[c["cmd"]](c)
        except Exception as e:  # report, keep serving commands
            answer = {"exception": repr(e)}
        print(json.dumps(answer), flush=True)
    for ch in channels.values():
        ch.close()


if __name__ == "__main__":
    main()
