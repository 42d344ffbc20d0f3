"""aim serve under a mixed load: 64 keep-alive clients for 60 s (by default) sending valid,
malformed and poisoned requests to a dynamically batched server.

    python3 tests/bench/serve_load.py AIM MODELS_DIR [--clients 64] [--seconds 60]

MODELS_DIR holds `tests/models/make_models.py`'s mlp_batch and bert_l6_batch. Each client
keeps one HTTP/1.1 connection and cycles through:
- valid mlp requests (JSON, 1-3 rows of random input), checked against the model computed
  in numpy;
- valid bert requests (the saved inputs, rolled), checked against the server's own answer
  to them before the load;
- malformed requests (invalid JSON, a wrong shape, an unknown input in place of the real
  one): a 400 naming the problem;
- poisoned bert requests (a token id outside the embedding table), which share batches with
  valid ones: an error of their own, never another request's.
Meanwhile another process asks `/v2/health/ready` every 20 ms, and the server's
resident memory is sampled every 0.5 s. Prints the counts, wrong or lost answers, the
health check's p50 / p99 / worst latency and the peak RSS; exits 1 when a valid answer was
wrong or lost, an error was someone else's, or the health p99 passed 50 ms.
"""
import argparse
import http.client
import importlib.util
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("serve_tests", os.path.join(HERE, "..", "serve.py"))
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)


def post(conn, model, body):
    conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


def tensor(name, a):
    kind = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}[a.dtype]
    return {"name": name, "datatype": kind, "shape": list(a.shape), "data": a.ravel().tolist()}


def outputs(text):
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in json.loads(text)["outputs"]}


def prober(host, port, stop, results):
    """Asks /v2/health/ready every 20 ms until `stop` on one kept-alive connection; puts
    the list of waits (seconds; 99 for a status other than 200) on `results`."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    waits = []
    while time.time() < stop:
        t = time.time()
        conn.request("GET", "/v2/health/ready")
        r = conn.getresponse()
        r.read()
        waits.append(time.time() - t if r.status == 200 else 99.0)
        time.sleep(0.02)
    results.put(waits)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("aim")
    ap.add_argument("models")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="aim-load-")
    mlp_path, bert_path = f"{args.models}/mlp_batch.onnx", f"{args.models}/bert_l6_batch.onnx"
    mlp_ref = serve.mlp_numpy(mlp_path)
    bert_feeds = dict(np.load(f"{args.models}/bert_l6_batch.inputs.npz"))
    srv = serve.Server(args.aim, ["--model", f"mlp={mlp_path}", "--model", f"bert={bert_path}",
                                  "--max-queue-delay-us", "2000"], os.path.join(tmp, "serve.log"))
    try:
        host, port = "127.0.0.1", srv.http
        c0 = http.client.HTTPConnection(host, port, timeout=60)
        ids, mask = bert_feeds["input_ids"], bert_feeds["attention_mask"]
        bert_bodies, bert_want = [], []
        for k in range(4):
            body = json.dumps({"inputs": [tensor("input_ids", np.roll(ids, k, axis=1)),
                                          tensor("attention_mask", mask)]}).encode()
            status, text = post(c0, "bert", body)
            assert status == 200, text[:200]
            bert_bodies.append(body)
            bert_want.append(outputs(text))
        poison = json.dumps({"inputs": [tensor("input_ids", np.full_like(ids, 10 ** 9)),
                                        tensor("attention_mask", mask)]}).encode()
        rng = np.random.default_rng(9)
        mlp_xs = [rng.standard_normal((1 + i % 3, 784)).astype(np.float32) for i in range(16)]
        mlp_bodies = [json.dumps({"inputs": [tensor("input", x)]}).encode() for x in mlp_xs]
        malformed = [
            (b'{"inputs": [', "not valid JSON"),
            (json.dumps({"inputs": [tensor("input", np.zeros((1, 783), np.float32))]}).encode(), "expected"),
            (json.dumps({"inputs": [tensor("nope", np.zeros((1, 784), np.float32))]}).encode(), "'input' is missing"),
        ]
        stop = time.time() + args.seconds
        lock = threading.Lock()
        counts = {"mlp": 0, "bert": 0, "malformed": 0, "poisoned": 0}
        problems = []

        def client(c):
            conn = http.client.HTTPConnection(host, port, timeout=120)
            i = c
            while time.time() < stop:
                i += 1
                kind = ["mlp", "mlp", "mlp", "bert", "malformed", "mlp", "poisoned", "mlp"][i % 8]
                try:
                    if kind == "mlp":
                        k = i % 16
                        status, text = post(conn, "mlp", mlp_bodies[k])
                        got = outputs(text)["gemm_15"] if status == 200 else None
                        ok = got is not None and np.allclose(got, mlp_ref(mlp_xs[k]), rtol=1e-4, atol=1e-4)
                    elif kind == "bert":
                        k = i % 4
                        status, text = post(conn, "bert", bert_bodies[k])
                        ok = status == 200 and all(np.allclose(v, bert_want[k][n], rtol=1e-4, atol=1e-4)
                                                   for n, v in outputs(text).items())
                    elif kind == "malformed":
                        body, words = malformed[i % 3]
                        status, text = post(conn, "mlp", body)
                        ok = status == 400 and words in json.loads(text)["error"]
                    else:
                        status, text = post(conn, "bert", poison)
                        ok = status in (400, 500) and "1000000000" in json.loads(text)["error"]
                except Exception as e:  # noqa: BLE001 (a lost answer)
                    ok, status, text = False, 0, repr(e).encode()
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=120)
                with lock:
                    counts[kind] += 1
                    if not ok:
                        problems.append(f"{kind} (client {c}): {status} {text[:160]!r}")

        peak = [0.0]

        def sampler():
            while time.time() < stop:
                peak[0] = max(peak[0], rss_mib(srv.proc.pid))
                time.sleep(0.5)
        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        threads.append(threading.Thread(target=sampler))
        # The health checks come from another process: the clients' threads share one
        # interpreter lock, which would delay a prober thread, not the server.
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        probe = ctx.Process(target=prober, args=(host, port, stop, results))
        probe.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        waits = results.get(timeout=120)
        probe.join()
        w = np.array(waits) * 1e3
        p50, p99, worst = np.percentile(w, 50), np.percentile(w, 99), w.max()
        print(f"CPU: {serve_cpu()}; {args.clients} keep-alive clients for {args.seconds:.0f} s")
        print(f"answered: {counts['mlp']} mlp, {counts['bert']} bert, {counts['malformed']} malformed, "
              f"{counts['poisoned']} poisoned; {len(problems)} wrong or lost")
        for p in problems[:10]:
            print("  ", p)
        print(f"/v2/health/ready: {len(w)} checks, p50 {p50:.1f} ms, p99 {p99:.1f} ms, worst {worst:.1f} ms")
        print(f"server peak RSS {peak[0]:.0f} MiB")
        failed = bool(problems) or p99 > 50
    finally:
        srv.stop()
    sys.exit(1 if failed else 0)


def serve_cpu():
    sys.path.insert(0, HERE)
    from side_by_side import cpu_name
    return cpu_name()


if __name__ == "__main__":
    main()
