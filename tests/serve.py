"""aim serve against Triton's own HTTP and gRPC clients (tritonclient[http,grpc]), on loopback
only.

    python3 tests/serve.py AIM MODELS_DIR

Starts `aim serve` with mlp_batch and bert_l6_batch (symbolic batch dims: dynamically
batched) and mobilenetv2 (fixed batch: served alone), then checks: health, server and model
metadata; binary and JSON inference equal to `aim run`'s outputs, and the same over gRPC
(metadata, raw-tensor inference, errors as gRPC status codes, concurrent clients batched
with the REST ones' counters); malformed requests
answered with 400/413 and an error naming the problem; a load test of 16 concurrent clients
(every response right, none lost, batching visible in the metrics, the metrics consistent
with the requests sent); SIGTERM with requests in flight answering all of them; and
deploy.yml (a cuda device falling back to the cpu, and a bad key refused before start).
Every loop is bounded; the servers are stopped on exit.
"""
import concurrent.futures as cf
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

RESULTS = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An `aim serve` process on free loopback ports, stopped on exit."""

    def __init__(self, aim, args, log):
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen([aim, "serve", "--host", "127.0.0.1", "--http-port", str(self.http),
                                      "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"127.0.0.1:{self.http}"
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aim serve exited with {self.proc.returncode}: {open(log).read()}")
            try:
                if urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2).status == 200:
                    return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("aim serve did not become ready in 120 s")

    def metric(self, name, model):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(f'{name}{{model="{model}",version="1"}} '):
                return float(line.split()[-1])
        raise KeyError(f"{name} for {model} not in /metrics")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        return self.proc.returncode


def post(url, body, headers=None):
    """POSTs raw bytes; returns (status, parsed JSON or None)."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def aim_run(aim, model, inputs, tmp):
    out = os.path.join(tmp, os.path.basename(model) + ".out.npz")
    subprocess.run([aim, "run", model, "--inputs", inputs, "--outputs", out], check=True, capture_output=True)
    return dict(np.load(out))


def infer(client, model, feeds, binary=True):
    ins = []
    for name, a in feeds.items():
        dt = {np.float32: "FP32", np.int64: "INT64"}[a.dtype.type]
        i = triton.InferInput(name, list(a.shape), dt)
        i.set_data_from_numpy(a, binary_data=binary)
        ins.append(i)
    outs = None if binary else [triton.InferRequestedOutput(n, binary_data=False) for n in OUTPUTS[model]]
    r = client.infer(model, ins, outputs=outs)
    return {n: r.as_numpy(n) for n in OUTPUTS[model]}


OUTPUTS = {}


def mlp_numpy(path):
    """The mlp's three Gemms in numpy: expected outputs for any batch."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    w = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    gemms = [n for n in m.graph.node if n.op_type == "Gemm"]

    def run(x):
        for k, n in enumerate(gemms):
            x = x.astype(np.float64) @ w[n.input[1]].T.astype(np.float64) + w[n.input[2]]
            if k < len(gemms) - 1:
                x = np.maximum(x, 0)
        return x
    return run


def main():
    aim, models = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="aim-serve-")
    paths = {"mlp": f"{models}/mlp_batch.onnx", "bert": f"{models}/bert_l6_batch.onnx",
             "mobilenetv2": f"{models}/mobilenetv2.onnx"}
    feeds_of = {"mlp": f"{models}/mlp_batch.inputs.npz", "bert": f"{models}/bert_l6_batch.inputs.npz",
                "mobilenetv2": f"{models}/mobilenetv2.inputs.npz"}
    expected = {m: aim_run(aim, paths[m], feeds_of[m], tmp) for m in paths}
    feeds = {m: dict(np.load(f)) for m, f in feeds_of.items()}
    args = [a for m, p in paths.items() for a in ("--model", f"{m}={p}")]
    srv = Server(aim, args + ["--threads", "1", "--max-request-bytes", "4M", "--max-queue-delay-us", "2000"],
                 os.path.join(tmp, "serve.log"))
    try:
        client = triton.InferenceServerClient(srv.url, concurrency=16)
        check("live and ready", client.is_server_live() and client.is_server_ready())
        meta = client.get_server_metadata()
        check("server metadata names the binary extension", "binary_tensor_data" in meta["extensions"], str(meta))
        mm = client.get_model_metadata("mlp")
        check("model metadata: -1 for the batch dim, FP32",
              mm["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 784]}], str(mm))
        bm = client.get_model_metadata("bert")
        check("model metadata: INT64 inputs", [i["datatype"] for i in bm["inputs"]] == ["INT64", "INT64"], str(bm))
        check("model ready", client.is_model_ready("bert") and client.is_model_ready("mobilenetv2"))
        for m in paths:
            meta = client.get_model_metadata(m)
            OUTPUTS[m] = [o["name"] for o in meta["outputs"]]
        # Inference, binary (the client's default) and JSON: equal to aim run's outputs.
        for m in paths:
            for binary in (True, False):
                got = infer(client, m, feeds[m], binary)
                same = all(np.array_equal(got[n], expected[m][n]) for n in OUTPUTS[m])
                check(f"{m}: {'binary' if binary else 'JSON'} outputs identical to aim run", same,
                      str({n: float(np.abs(got[n] - expected[m][n]).max()) for n in OUTPUTS[m]}))
        grpc_failures = grpc_checks(srv, feeds, expected, mlp_numpy(paths["mlp"]))
        errors = error_cases(srv, feeds) + grpc_failures
        load_test(srv, feeds, expected, mlp_numpy(paths["mlp"]), errors)
        poisoned_batches(srv, feeds)
        keep_alive_after_unread_bodies(srv)
        shutdown_in_flight(srv, feeds["bert"])
    finally:
        srv.stop()
    half_sent_requests(aim, models, tmp)
    large_json_bodies(aim, models, tmp)
    deploy_file(aim, models, tmp)
    custom_ops(aim, tmp)
    int4_weights(aim, models, tmp)
    print(f"serve: {RESULTS['passed']} passed, {RESULTS['failed']} failed")
    sys.exit(1 if RESULTS["failed"] else 0)


def grpc_infer(client, model, feeds):
    ins = []
    for name, a in feeds.items():
        i = triton_grpc.InferInput(name, list(a.shape), {np.float32: "FP32", np.int64: "INT64"}[a.dtype.type])
        i.set_data_from_numpy(a)
        ins.append(i)
    r = client.infer(model, ins)
    return {n: r.as_numpy(n) for n in OUTPUTS[model]}


def raw_and_typed(srv, x):
    """A gRPC request whose one input has both raw_input_contents and typed contents (the
    Triton client never sends that; the protocol allows writing it)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc}") as ch:
        req = service_pb2.ModelInferRequest(model_name="mlp")
        t = req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        t.contents.fp32_contents.extend(x.ravel().tolist())
        req.raw_input_contents.append(x.tobytes())
        service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)


def grpc_status(call):
    """The gRPC status name and message a call fails with ("OK" when it does not)."""
    try:
        call()
        return "OK", ""
    except InferenceServerException as e:
        return str(e.status()), e.message()
    except Exception as e:  # noqa: BLE001 (grpc.RpcError from the raw stub)
        if hasattr(e, "code") and hasattr(e, "details"):
            return str(e.code()), e.details()
        raise


def grpc_checks(srv, feeds, expected, mlp_ref):
    """The gRPC API with Triton's gRPC client: metadata, inference bit for bit aim run's,
    errors as status codes, and concurrent clients batched and counted in the metrics.
    Returns how many requests to the mlp failed (for the metrics check)."""
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{srv.grpc}")
    check("grpc: live and ready", client.is_server_live() and client.is_server_ready())
    meta = client.get_server_metadata()
    check("grpc: server metadata", meta.name == "aim" and "binary_tensor_data" in meta.extensions, str(meta))
    mm = client.get_model_metadata("mlp")
    check("grpc: model metadata: -1 for the batch dim, FP32",
          [(i.name, i.datatype, list(i.shape)) for i in mm.inputs] == [("input", "FP32", [-1, 784])], str(mm))
    check("grpc: model ready", client.is_model_ready("bert") and not grpc_status(lambda: client.is_model_ready("nope"))[0] == "OK")
    for m in ("mlp", "bert", "mobilenetv2"):
        got = grpc_infer(client, m, feeds[m])
        same = all(np.array_equal(got[n], expected[m][n]) for n in OUTPUTS[m])
        check(f"grpc: {m}: outputs identical to aim run", same,
              str({n: float(np.abs(got[n] - expected[m][n]).max()) for n in OUTPUTS[m]}))
    x = feeds["mlp"]["input"]
    wrong = triton_grpc.InferInput("input", list(x.shape), "INT64")
    wrong.set_data_from_numpy(x.astype(np.int64))
    good = triton_grpc.InferInput("input", list(x.shape), "FP32")
    good.set_data_from_numpy(x)
    short = triton_grpc.InferInput("input", [1, 783], "FP32")
    short.set_data_from_numpy(np.zeros((1, 783), np.float32))
    cases = [
        ("unknown model", lambda: grpc_infer(client, "nope", {"input": x}), "StatusCode.NOT_FOUND", "unknown model"),
        ("wrong datatype", lambda: client.infer("mlp", [wrong]), "StatusCode.INVALID_ARGUMENT", "takes FP32"),
        ("wrong shape", lambda: client.infer("mlp", [short]), "StatusCode.INVALID_ARGUMENT", "expected [-1, 784]"),
        ("unknown output", lambda: client.infer("mlp", [good], outputs=[triton_grpc.InferRequestedOutput("nope")]),
         "StatusCode.INVALID_ARGUMENT", "no output named 'nope'"),
        ("a call aim does not serve", lambda: client.get_model_config("mlp"), "StatusCode.UNIMPLEMENTED", "ModelConfig"),
        ("an input given twice", lambda: client.infer("mlp", [good, good]), "StatusCode.INVALID_ARGUMENT",
         "input 'input' is given twice"),
        ("raw and typed contents together", lambda: raw_and_typed(srv, x), "StatusCode.INVALID_ARGUMENT",
         "has both raw_input_contents and contents"),
    ]
    for name, call, code, words in cases:
        got, msg = grpc_status(call)
        check(f"grpc error: {name} -> {code}", got == code and words in msg, f"{got} {msg}")
    # The malformed requests that reached the mlp count as its failures.
    mlp_failures = sum(1 for c in cases if c[0] in ("wrong datatype", "wrong shape", "unknown output",
                                                    "an input given twice", "raw and typed contents together"))
    # Concurrent gRPC clients: every answer right, batched, counted with the REST requests.
    ok0 = srv.metric("nv_inference_request_success", "mlp")
    exec0, count0 = srv.metric("nv_inference_exec_count", "mlp"), srv.metric("nv_inference_count", "mlp")
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((1 + i % 2, 784)).astype(np.float32) for i in range(8)]
    problems = []

    def loop(c):
        cl = triton_grpc.InferenceServerClient(f"127.0.0.1:{srv.grpc}")
        for r in range(12):
            xi = xs[(c + r) % 8]
            got = grpc_infer(cl, "mlp", {"input": xi})["gemm_15"]
            if not np.allclose(got, mlp_ref(xi), rtol=1e-4, atol=1e-4):
                problems.append(f"client {c} request {r}")
    with cf.ThreadPoolExecutor(8) as ex:
        for f in [ex.submit(loop, c) for c in range(8)]:
            try:
                f.result(timeout=300)
            except Exception as e:  # noqa: BLE001 (a failed client is a lost request)
                problems.append(repr(e))
    ok = srv.metric("nv_inference_request_success", "mlp") - ok0
    execs = srv.metric("nv_inference_exec_count", "mlp") - exec0
    count = srv.metric("nv_inference_count", "mlp") - count0
    check(f"grpc load: 8 clients x 12 mlp requests all correct, counted ({int(ok)}), "
          f"batched ({int(execs)} runs for {int(count)} rows)",
          not problems and ok == 96 and 0 < execs < count, "; ".join(problems[:5]) or f"{ok} {execs} {count}")
    return mlp_failures


def error_cases(srv, feeds):
    """Malformed requests: 400s (413 for an oversized body) naming the problem; returns how
    many requests to the mlp failed (for the metrics check)."""
    base = f"http://{srv.url}/v2/models"
    x = feeds["mlp"]["input"]
    good = {"name": "input", "shape": [1, 784], "datatype": "FP32", "data": x.ravel().tolist()}

    def req(inputs):
        return json.dumps({"inputs": inputs}).encode()
    cases = [
        ("bad JSON", "mlp", b'{"inputs": [', {}, 400, "not valid JSON"),
        ("wrong datatype", "mlp", req([dict(good, datatype="INT64", data=[0] * 784)]), {}, 400, "takes FP32"),
        ("wrong shape", "mlp", req([dict(good, shape=[1, 783], data=[0.0] * 783)]), {}, 400, "expected [-1, 784]"),
        ("unknown model", "nope", req([good]), {}, 400, "unknown model 'nope'"),
        ("unknown input", "mlp", req([good, dict(good, name="extra")]), {}, 400, "no input named 'extra'"),
        ("missing input", "mlp", req([]), {}, 400, "'input' is missing"),
        ("batch over max_batch_size", "mlp", req([dict(good, shape=[9, 784], data=[0.0] * 9 * 784)]), {}, 400,
         "max_batch_size"),
    ]
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 784 * 4}}]}).encode()
    cases.append(("binary size mismatch", "mlp", head + x.tobytes()[:-4],
                  {"Inference-Header-Content-Length": str(len(head))}, 400, "past the end"))
    for name, model, body, headers, status, words in cases:
        code, text = post(f"{base}/{model}/infer", body, headers)
        try:
            msg = json.loads(text)["error"]
        except (ValueError, KeyError):
            msg = text[:200]
        check(f"error: {name} -> {status}", code == status and words in msg, f"{code} {msg}")
    # Bodies over --max-request-bytes (4 MiB here): refused from the Content-Length before
    # they are read, and when sent chunked, once the limit is passed.
    for chunked in (False, True):
        code, msg = oversized(srv, chunked)
        check(f"error: a body over --max-request-bytes{' (chunked)' if chunked else ''} -> 413",
              code == 413 and "over the server's limit" in msg, f"{code} {msg}")
    return sum(1 for c in cases if c[1] == "mlp") + 2


def read_response(sock):
    """One HTTP response from a raw socket (a Content-Length body): status, lower-cased head."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            return 0, data.decode(errors="replace").lower()
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"content-length: *(\d+)", head.lower())
    need = int(m.group(1)) if m else 0
    while len(body) < need:
        part = sock.recv(65536)
        if not part:
            break
        body += part
    return (int(head.split()[1]) if head.startswith(b"HTTP/") else 0), head.decode(errors="replace").lower()


def keep_alive_after_unread_bodies(srv):
    """A request answered before its body is read (an unknown model, a 100 KB body): the
    connection stays usable for the next request; a body over the limit: the answer says
    `Connection: close`."""
    with socket.create_connection(("127.0.0.1", srv.http), timeout=30) as s:
        body = b" " * 100_000
        s.sendall(b"POST /v2/models/nosuch/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                  + body)
        first, _ = read_response(s)
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            second, _ = read_response(s)
        except OSError as e:
            second = repr(e)
    check("keep-alive: an unknown model's 100 KB body is drained, the next request on the connection works",
          first == 400 and second == 200, f"{first} then {second}")
    with socket.create_connection(("127.0.0.1", srv.http), timeout=30) as s:
        s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (5 << 20))
        code, head = read_response(s)
    check("keep-alive: a body over the limit is answered with Connection: close",
          code == 413 and "connection: close" in head, f"{code} {head!r}")


def oversized(srv, chunked):
    """Sends the start of a 5 MiB body on a raw socket and reads the answer (the server answers
    without reading it all, as HTTP allows)."""
    size = 5 << 20
    with socket.create_connection(("127.0.0.1", srv.http), timeout=30) as s:
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
        s.sendall(f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode())
        try:
            if chunked:
                s.sendall(f"{size:x}\r\n".encode())
            for _ in range(size // 65536):
                s.sendall(b" " * 65536)
        except OSError:
            pass  # the server answered and closed: read what it said
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data) < data.find(b"\r\n\r\n") + 4 + 10:
                part = s.recv(65536)
                if not part:
                    break
                data += part
        except OSError:
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    code = int(head.split()[1]) if head.startswith(b"HTTP/") else 0
    if b"transfer-encoding: chunked" in head.lower():
        body = body.split(b"\r\n", 1)[-1]
    return code, body.decode(errors="replace")


def load_test(srv, feeds, expected, mlp_ref, mlp_failures):
    """16 concurrent clients x bounded requests against mlp and bert: every response right,
    none lost, batching visible, metrics consistent."""
    rng = np.random.default_rng(5)
    mlp_inputs = [rng.standard_normal((1 + (i % 3), 784)).astype(np.float32) for i in range(16)]
    ids = feeds["bert"]["input_ids"]
    bert_inputs = [{"input_ids": np.roll(ids, k, axis=1), "attention_mask": feeds["bert"]["attention_mask"]}
                   for k in range(4)]
    bert_expected = [None] * 4
    client0 = triton.InferenceServerClient(srv.url)
    for k in range(4):
        bert_expected[k] = infer(client0, "bert", bert_inputs[k])
    before = {m: (srv.metric("nv_inference_request_success", m), srv.metric("nv_inference_count", m),
                  srv.metric("nv_inference_exec_count", m)) for m in ("mlp", "bert")}
    per_client = {"mlp": 24, "bert": 3}
    sent = {"mlp": 0, "bert": 0}
    rows = {"mlp": 0, "bert": 0}
    lock = threading.Lock()
    problems = []

    def client_loop(c):
        cl = triton.InferenceServerClient(srv.url)
        for r in range(per_client["mlp"]):
            x = mlp_inputs[(c + r) % 16]
            got = infer(cl, "mlp", {"input": x})["gemm_15"]
            if not np.allclose(got, mlp_ref(x), rtol=1e-4, atol=1e-4):
                problems.append(f"mlp client {c} request {r}: off by {np.abs(got - mlp_ref(x)).max()}")
            with lock:
                sent["mlp"] += 1
                rows["mlp"] += x.shape[0]
        for r in range(per_client["bert"]):
            k = (c + r) % 4
            got = infer(cl, "bert", bert_inputs[k])
            for n, v in got.items():
                if not np.allclose(v, bert_expected[k][n], rtol=1e-4, atol=1e-4):
                    problems.append(f"bert client {c} request {r}: off by {np.abs(v - bert_expected[k][n]).max()}")
            with lock:
                sent["bert"] += 1
                rows["bert"] += 1
    t = time.time()
    with cf.ThreadPoolExecutor(16) as ex:
        for f in [ex.submit(client_loop, c) for c in range(16)]:
            try:
                f.result(timeout=600)
            except Exception as e:  # noqa: BLE001 (any client failure is a lost request)
                problems.append(f"a client failed: {e!r}")
    took = time.time() - t
    check(f"load: 16 clients, {sent['mlp']} mlp and {sent['bert']} bert requests in {took:.1f} s, all correct",
          not problems and sent == {"mlp": 16 * per_client["mlp"], "bert": 16 * per_client["bert"]},
          "; ".join(problems[:5]))
    for m in ("mlp", "bert"):
        ok0, count0, exec0 = before[m]
        ok = srv.metric("nv_inference_request_success", m) - ok0
        count = srv.metric("nv_inference_count", m) - count0
        execs = srv.metric("nv_inference_exec_count", m) - exec0
        check(f"load: {m} metrics count every request ({int(ok)}) and row ({int(count)})",
              ok == sent[m] and count == rows[m], f"success {ok} vs {sent[m]}, count {count} vs {rows[m]}")
        check(f"load: {m} batched ({int(execs)} runs for {int(count)} rows)", 0 < execs < count)
        check(f"load: {m} nothing pending afterwards", srv.metric("nv_inference_pending_request_count", m) == 0)
    text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics}/metrics", timeout=10).read().decode()
    exposed = {l.split("{")[0].split()[0] for l in text.splitlines() if l and not l.startswith("#")}
    dashboard = open(os.path.join(os.path.dirname(__file__), "..", "deploy", "dashboard.json")).read()
    used = set(re.findall(r"\b(nv_inference_\w+|aim_\w+)", dashboard))
    check("deploy/dashboard.json reads only metrics the server exposes", used and used <= exposed,
          str(sorted(used - exposed)))
    check("metrics: the failed mlp requests are counted",
          srv.metric("nv_inference_request_failure", "mlp") == mlp_failures,
          f"{srv.metric('nv_inference_request_failure', 'mlp')} vs {mlp_failures}")


def poisoned_batches(srv, feeds):
    """Requests that fail (a token id outside the embedding table) among valid ones, 10
    concurrent clients, so that they share dynamic batches: each valid request gets its own
    right answer and each bad one its own error (a failed batch is run again request by
    request; the number of runs is printed)."""
    ids, mask = feeds["bert"]["input_ids"], feeds["bert"]["attention_mask"]
    good = {"input_ids": ids, "attention_mask": mask}
    want = infer(triton.InferenceServerClient(srv.url), "bert", good)
    bad = {"input_ids": np.full_like(ids, 10 ** 9), "attention_mask": mask}
    execs0 = srv.metric("nv_inference_exec_count", "bert")
    problems, answered = [], {"good": 0, "bad": 0}
    lock = threading.Lock()

    def one(k):
        cl = triton.InferenceServerClient(srv.url)
        if k % 5 == 4:
            try:
                infer(cl, "bert", bad)
                problems.append(f"request {k} (bad ids) succeeded")
            except InferenceServerException as e:
                if "1000000000" not in str(e):
                    problems.append(f"request {k} (bad ids) got another error: {str(e)[:120]}")
            with lock:
                answered["bad"] += 1
            return
        try:
            got = infer(cl, "bert", good)
        except InferenceServerException as e:
            problems.append(f"valid request {k} failed: {str(e)[:160]}")
            return
        for n, v in got.items():
            if not np.allclose(v, want[n], rtol=1e-4, atol=1e-4):
                problems.append(f"valid request {k}: {n} off by {np.abs(v - want[n]).max()}")
        with lock:
            answered["good"] += 1
    with cf.ThreadPoolExecutor(10) as ex:
        for f in [ex.submit(one, k) for k in range(60)]:
            f.result(timeout=600)
    execs = srv.metric("nv_inference_exec_count", "bert") - execs0
    check(f"poisoned batches: {answered['good']} valid requests answered right, {answered['bad']} bad ones "
          f"their own error ({int(execs)} runs)", not problems and answered == {"good": 48, "bad": 12},
          "; ".join(problems[:4]))


def shutdown_in_flight(srv, bert_feeds):
    """SIGTERM while requests are in flight: every one is answered, then the server exits."""
    body = json.dumps({"inputs": [
        {"name": n, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
        for n, a in bert_feeds.items()]}).encode()
    url = f"http://{srv.url}/v2/models/bert/infer"
    with cf.ThreadPoolExecutor(12) as ex:
        futures = [ex.submit(post, url, body, {"Content-Type": "application/json"}) for _ in range(12)]
        # Wait until the server holds every request not yet answered (so none is still
        # connecting), then stop it.
        deadline = time.time() + 30
        while time.time() < deadline:
            pending = srv.metric("nv_inference_pending_request_count", "bert")
            if pending > 0 and pending + sum(f.done() for f in futures) >= 12:
                break
            time.sleep(0.002)
        srv.proc.send_signal(signal.SIGTERM)
        codes = [f.result(timeout=120)[0] for f in futures]
    rc = srv.proc.wait(120)
    check(f"shutdown: {int(pending)} requests in flight at SIGTERM, all answered 200, exit 0",
          pending > 0 and codes == [200] * 12 and rc == 0, f"codes {codes}, exit {rc}")


def half_sent_requests(aim, models, tmp):
    """SIGTERM while a client holds half a request (its headers, and 10 of the 1000 body
    bytes it announced): the server closes it after --shutdown-timeout (2 s here) and exits,
    instead of waiting for the client."""
    srv = Server(aim, ["--model", f"mlp={models}/mlp_batch.onnx", "--shutdown-timeout", "2"],
                 os.path.join(tmp, "half.log"))
    with socket.create_connection(("127.0.0.1", srv.http), timeout=30) as s:
        s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"{" * 10)
        time.sleep(0.5)
        t = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.time() - t
    srv.stop()
    check(f"shutdown: a half-sent request is closed after --shutdown-timeout 2 ({took:.1f} s), exit 0",
          rc == 0 and took < 10, f"exit {rc} after {took:.1f} s")


def large_json_bodies(aim, models, tmp):
    """Two clients sending 40 MB JSON bodies back to back (valid JSON, 4.4M numbers, the
    wrong element count: a 400 after the whole body is decoded): the decoding runs off the
    server's I/O threads, so /v2/health/live answers at once throughout, and it streams the
    numbers into one compact vector, so the server's peak memory stays far below the
    ~20 bytes per body byte a JSON tree takes."""
    srv = Server(aim, ["--model", f"mlp={models}/mlp_batch.onnx", "--max-request-bytes", "64M"],
                 os.path.join(tmp, "large.log"))
    numbers = ",".join(["0.1234567"] * 4_400_000)
    body = ('{"inputs":[{"name":"input","datatype":"FP32","shape":[1,784],"data":[' + numbers + ']}]}').encode()
    url = f"http://{srv.url}/v2/models/mlp/infer"
    stop, answers, waits = time.time() + 6, [], []

    def sender():
        while time.time() < stop:
            answers.append(post(url, body, {"Content-Type": "application/json"}))
    threads = [threading.Thread(target=sender) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    while time.time() < stop:
        t0 = time.time()
        ok = urllib.request.urlopen(f"http://{srv.url}/v2/health/live", timeout=30).status == 200
        waits.append(time.time() - t0 if ok else 99.0)
        time.sleep(0.05)
    for t in threads:
        t.join()
    # Metrics as Triton keeps them: failures are counted, not timed; the clock starts once a
    # body is decoded, so a client's slow upload (1 s here) is not the server's latency.
    failed_us = srv.metric("nv_inference_request_duration_us", "mlp")
    good = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784],
                                   "data": [0.0] * 784}]}).encode()
    with socket.create_connection(("127.0.0.1", srv.http), timeout=30) as sk:
        sk.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(good)}\r\n\r\n".encode() + good[:100])
        time.sleep(1.0)
        sk.sendall(good[100:])
        status, _ = read_response(sk)
    slow_us = srv.metric("nv_inference_request_duration_us", "mlp") - failed_us
    hwm = 0
    with open(f"/proc/{srv.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) // 1024
    srv.stop()
    counted = all(code == 400 and b"4400000 elements" in text for code, text in answers)
    check(f"large JSON bodies: {len(answers)} answered 400 naming the element count", answers and counted,
          str(answers[:1])[:300])
    # Measured before the change: health checks waited up to 0.19-0.26 s behind the parses on
    # the runtime's threads, and the JSON trees took the server to 440 MiB; after it, 0.017 s
    # and 233 MiB (two 40 MB bodies plus their leaves, 16 bytes a number).
    check(f"large JSON bodies: /v2/health/live within 0.12 s throughout (worst {max(waits):.3f} s)",
          max(waits) < 0.12, str(sorted(waits)[-5:]))
    check(f"large JSON bodies: peak memory {hwm} MiB, under 330 MiB for two 40 MB bodies at once", hwm < 330)
    check(f"metrics: {len(answers)} failed requests add no request duration ({failed_us:.0f} us)", failed_us == 0)
    check(f"metrics: a request uploaded over 1 s is timed from its decoding ({slow_us:.0f} us)",
          status == 200 and 0 < slow_us < 500_000, f"status {status}")


def deploy_file(aim, models, tmp):
    """deploy.yml: a cuda device's traffic goes to its cpu fallback, said in /v2 and the log;
    an unknown key is refused before the server starts, naming it."""
    models = os.path.abspath(models)
    cfg = os.path.join(tmp, "deploy.yml")
    # Version 2 is a directory holding one model file, as KServe mounts one.
    v2 = os.path.join(tmp, "v2")
    os.makedirs(v2, exist_ok=True)
    shutil.copy(f"{models}/mlp_batch.onnx", os.path.join(v2, "model.onnx"))
    with open(cfg, "w") as f:
        f.write(f"models:\n  - name: mlp\n    versions:\n      - {{version: 1, path: {models}/mlp_batch.onnx}}\n"
                f"      - {{version: 2, path: v2}}\n    max_batch_size: 4\n"
                "devices:\n  - {name: gpu0, type: cuda, weight: 3, fallback: cpu0}\n  - {name: cpu0, type: x86}\n"
                "scheduler:\n  policy: round-robin\n  max_queue_delay_microseconds: 100\n")
    log = os.path.join(tmp, "deploy.log")
    srv = Server(aim, ["--config", cfg], log)
    try:
        meta = json.loads(urllib.request.urlopen(f"http://{srv.url}/v2", timeout=10).read())
        gpu = [d for d in meta["devices"] if d["name"] == "gpu0"][0]
        check("deploy.yml: the cuda device falls back to cpu0 (/v2)",
              gpu["serving"] is False and gpu["traffic_to"] == "cpu0", str(meta["devices"]))
        versions = json.loads(urllib.request.urlopen(f"http://{srv.url}/v2/models/mlp", timeout=10).read())["versions"]
        client = triton.InferenceServerClient(srv.url)
        x = np.ones((2, 784), np.float32)
        i = triton.InferInput("input", [2, 784], "FP32")
        i.set_data_from_numpy(x)
        r = client.infer("mlp", [i], model_version="1")
        check("deploy.yml: two versions served", versions == ["1", "2"] and r.as_numpy("gemm_15").shape == (2, 10),
              str(versions))
    finally:
        srv.stop()
    check("deploy.yml: the log says where the cuda traffic goes", "its traffic goes to 'cpu0'" in open(log).read())
    bad = os.path.join(tmp, "bad.yml")
    with open(bad, "w") as f:
        f.write(f"models:\n  - name: mlp\n    path: {models}/mlp_batch.onnx\n    max_batch: 4\n")
    r = subprocess.run([aim, "serve", "--config", bad, "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=60)
    check("deploy.yml: an unknown key is refused before start, naming it",
          r.returncode != 0 and "max_batch" in r.stderr, r.stderr.strip())


def custom_ops(aim, tmp):
    """A model with custom ops (examples/custom_op/custom_ops.c, built with gcc), served with
    the library given by --custom-ops and by deploy.yml's custom_ops: batched requests
    answered as the same model with the ops written out in ONNX answers them."""
    import onnx
    from onnx import TensorProto, helper
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lib = os.path.join(tmp, "libcustom_ops.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-I", os.path.join(root, "include"),
                    os.path.join(root, "examples", "custom_op", "custom_ops.c"), "-o", lib], check=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = os.path.join(tmp, "custom.onnx")
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("ScaleShift", ["x"], ["s"], domain="com.example", scale=2.0, shift=-1.0),
         helper.make_node("Relu", ["s"], ["r"]), helper.make_node("PairSum", ["r"], ["y"], domain="com.example")],
        "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]), model)
    cfg = os.path.join(tmp, "custom.yml")
    with open(cfg, "w") as f:
        f.write(f"models:\n  - {{name: custom, path: {model}}}\ncustom_ops: [libcustom_ops.so]\n")
    for how, args in [("--custom-ops", ["--custom-ops", lib, "--model", f"custom={model}"]),
                      ("deploy.yml custom_ops", ["--config", cfg])]:
        srv = Server(aim, args, os.path.join(tmp, "custom.log"))
        try:
            client = triton.InferenceServerClient(srv.url, concurrency=8)
            xs = [np.random.default_rng(k).standard_normal((1 + k % 3, 6)).astype(np.float32) for k in range(8)]
            ins = []
            for xv in xs:
                i = triton.InferInput("x", list(xv.shape), "FP32")
                i.set_data_from_numpy(xv)
                ins.append(i)
            pending = [client.async_infer("custom", [i]) for i in ins]
            worst = 0.0
            for xv, p in zip(xs, pending):
                r = np.maximum(xv * 2 - 1, 0)
                worst = max(worst, float(np.abs(p.get_result().as_numpy("y") - (r[:, 0::2] + r[:, 1::2])).max()))
            check(f"custom ops ({how}): 8 concurrent requests equal to the ops written out", worst < 1e-5,
                  f"max diff {worst}")
        finally:
            srv.stop()


def int4_weights(aim, models, tmp):
    """deploy.yml's `weights: int4`: the served model answers as `aim run --weights int4`."""
    model = os.path.abspath(f"{models}/mlp_batch.onnx")
    cfg = os.path.join(tmp, "int4.yml")
    with open(cfg, "w") as f:
        f.write(f"models:\n  - {{name: mlp, path: {model}, weights: int4}}\n")
    x = np.random.default_rng(0).random((2, 784), dtype=np.float32)
    srv = Server(aim, ["--config", cfg], os.path.join(tmp, "int4.log"))
    try:
        i = triton.InferInput("input", [2, 784], "FP32")
        i.set_data_from_numpy(x)
        got = triton.InferenceServerClient(srv.url).infer("mlp", [i]).as_numpy("gemm_15")
    finally:
        srv.stop()
    np.savez(os.path.join(tmp, "int4.in.npz"), input=x)
    out = os.path.join(tmp, "int4.out.npz")
    subprocess.run([aim, "run", model, "--weights", "int4", "--inputs", os.path.join(tmp, "int4.in.npz"), "--outputs", out],
                   check=True, capture_output=True)
    want = np.load(out)["gemm_15"]
    check("deploy.yml weights: int4 answers as aim run --weights int4", np.array_equal(got, want),
          f"max diff {float(np.abs(got - want).max())}")


if __name__ == "__main__":
    main()
